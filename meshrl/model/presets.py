"""Size presets: configurations only, no weights. Used by the planner, benchmarks and the demo.

The large ones copy the published config.json of each model (Meta's LLaMA-2 and CodeLLaMA
releases, Qwen's Qwen2.5 releases); tests/model/test_presets.py checks their parameter counts
against the published totals.
"""

from __future__ import annotations

from .config import ConfigError, ModelConfig, RopeScaling

_LLAMA2 = dict(model_type="llama", vocab_size=32000, rms_norm_eps=1e-5, max_position_embeddings=4096,
               bos_token_id=1, eos_token_id=2)
_QWEN3 = dict(vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960,
              bos_token_id=151643, eos_token_id=151645, head_dim=128, rope_format="rope_parameters")
_QWEN25 = dict(model_type="qwen2", attention_bias=True, rope_theta=1e6, rms_norm_eps=1e-6,
               max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151645)

PRESETS: dict[str, ModelConfig] = {
    # Built-in demo model (~1.2M parameters). The vocabulary is the byte tokenizer's 256 bytes + 3
    # specials, padded to 264 so that a vocabulary-parallel head splits over tp = 1, 2, 4, 8;
    # 8 heads, 2 KV heads (grouped-query) and 8 layers so that every layout with dp*tp*pp <= 8 fits.
    "tiny": ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
                        rms_norm_eps=1e-6, max_position_embeddings=512, model_type="llama",
                        bos_token_id=257, eos_token_id=258, pad_token_id=256),
    # The families beyond LLaMA at the tiny size, for `meshrl check parallel --model NAME` and the
    # tests: Qwen3 (head_dim 24 != 128/8, q/k norms, YaRN past an original context of 8 tokens),
    # Llama 3.x scaling, and a Qwen3-MoE with 8 experts (top-2) that every tp <= 8 shards.
    "tiny-qwen3": ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=24, rope_theta=10000.0,
                              max_position_embeddings=32, model_type="qwen3", bos_token_id=257,
                              eos_token_id=258, pad_token_id=256,
                              rope_scaling=RopeScaling("yarn", factor=4.0, original_max_position_embeddings=8),
                              rope_format="rope_parameters"),
    "tiny-llama3": ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                               num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
                               max_position_embeddings=32, model_type="llama", bos_token_id=257,
                               eos_token_id=258, pad_token_id=256,
                               rope_scaling=RopeScaling("llama3", factor=8.0, low_freq_factor=1.0,
                                                        high_freq_factor=4.0, original_max_position_embeddings=8)),
    "tiny-moe": ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                            num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
                            max_position_embeddings=512, model_type="qwen3_moe", bos_token_id=257,
                            eos_token_id=258, pad_token_id=256, num_experts=8, num_experts_per_tok=2,
                            moe_intermediate_size=64, norm_topk_prob=True),
    # ~100M parameters, tied embeddings; for benchmarks on one CPU machine.
    "small": ModelConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=True,
                         max_position_embeddings=2048, model_type="llama"),
    "llama2-7b": ModelConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=32, **_LLAMA2),
    "llama2-13b": ModelConfig(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                              num_attention_heads=40, num_key_value_heads=40, **_LLAMA2),
    "codellama-34b": ModelConfig(vocab_size=32000, hidden_size=8192, intermediate_size=22016,
                                 num_hidden_layers=48, num_attention_heads=64, num_key_value_heads=8,
                                 rope_theta=1e6, rms_norm_eps=1e-5, max_position_embeddings=16384,
                                 model_type="llama", bos_token_id=1, eos_token_id=2),
    "llama2-70b": ModelConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                              num_attention_heads=64, num_key_value_heads=8, **_LLAMA2),
    "qwen2.5-0.5b": ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                tie_word_embeddings=True, **_QWEN25),
    "qwen2.5-1.5b": ModelConfig(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                tie_word_embeddings=True, **_QWEN25),
    "qwen2.5-7b": ModelConfig(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                              num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                              **_QWEN25),
    "qwen2.5-14b": ModelConfig(vocab_size=152064, hidden_size=5120, intermediate_size=13824,
                               num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                               **_QWEN25),
    "qwen2.5-32b": ModelConfig(vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                               num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                               **_QWEN25),
    "qwen2.5-72b": ModelConfig(vocab_size=152064, hidden_size=8192, intermediate_size=29568,
                               num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                               **_QWEN25),
    # Llama 3.1 (Meta's config.json: rope_scaling llama3, factor 8 over an original 8192 context)
    "llama3.1-8b": ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                               rms_norm_eps=1e-5, max_position_embeddings=131072, model_type="llama",
                               bos_token_id=128000, eos_token_id=128001,
                               rope_scaling=RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                        original_max_position_embeddings=8192)),
    "qwen3-8b": ModelConfig(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                            num_key_value_heads=8, model_type="qwen3", **_QWEN3),
    # Mixture of experts: Qwen3-30B-A3B (128 experts, top-8, 48 layers) and Mixtral-8x7B (8, top-2)
    "qwen3-30b-a3b": ModelConfig(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                                 num_attention_heads=32, num_key_value_heads=4, model_type="qwen3_moe",
                                 num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                                 norm_topk_prob=True, **_QWEN3),
    "mixtral-8x7b": ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, rope_theta=1e6, rms_norm_eps=1e-5,
                                max_position_embeddings=32768, model_type="mixtral", num_experts=8,
                                num_experts_per_tok=2, bos_token_id=1, eos_token_id=2),
}


def get_preset(name: str) -> ModelConfig:
    """The preset's configuration; an unknown name raises ConfigError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}") from None
