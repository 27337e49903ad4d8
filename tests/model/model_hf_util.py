"""Helpers shared by the model tests: small random transformers models, the oracle."""

from __future__ import annotations

import torch
import transformers

ARCH = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def hf_model(arch: str, kv_heads: int = 2, tied: bool = False, seed: int = 0, vocab: int = 96,
             **extra) -> torch.nn.Module:
    """A random tiny HF causal LM in float32, eval mode. Init std 0.1 (not 0.02) spreads the logits,
    so greedy decoding is far from ties and a token comparison tests the model, not rounding."""
    cfg_cls, model_cls = ARCH[arch]
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=kv_heads, tie_word_embeddings=tied,
              max_position_embeddings=256, rope_theta=5000.0, initializer_range=0.1,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "mistral":
        kw["sliding_window"] = None
    kw.update(extra)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**kw, attn_implementation="eager")).to(torch.float32).eval()
    with torch.no_grad():  # HF zeroes biases and sets norms to 1: randomise them so they are tested
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


FAMILY = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    **ARCH,
}


def hf_family_model(arch: str, seed: int = 0, vocab: int = 96, **extra) -> torch.nn.Module:
    """A random tiny model of any family (dense, Qwen3, MoE), float32, eval mode, every weight random
    (HF sets norms to 1 and may zero routers: perturbed so they are tested). ``extra`` overrides the
    config (e.g. rope_scaling, num_experts)."""
    cfg_cls, model_cls = FAMILY[arch]
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
              rope_theta=5000.0, initializer_range=0.1, bos_token_id=1, eos_token_id=None, pad_token_id=0)
    if arch == "qwen3_moe":
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    if arch == "mixtral":
        kw.update(num_local_experts=4, num_experts_per_tok=2)
    kw.update(extra)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**kw, attn_implementation="eager")).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif "gate.weight" in name or "experts" in name:  # routers: spread the scores
                p.normal_(0.0, 0.3)
    return model
