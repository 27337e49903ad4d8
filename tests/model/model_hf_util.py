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
