"""Model configuration for the LLaMA / Qwen2 / Mistral family, and pure shape math.

Parameter names follow Hugging Face exactly (``model.layers.3.self_attn.q_proj.weight``), so that
checkpoint I/O is a rename-free copy and the planner's ShardMap speaks the same names as the
checkpoint on disk. Nothing here touches torch: the planner imports it to size 70B models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import UserError

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


class ConfigError(UserError, ValueError):
    """A model configuration that cannot be built; the message names the culprit."""


@dataclass(frozen=True)
class ModelConfig:
    """One decoder-only transformer. Field names follow HF's config.json where they exist."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0  # 0 means hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q, k and v projections
    model_type: str = "llama"  # llama | qwen2 | mistral
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    pad_token_id: int | None = None
    sliding_window: int | None = None  # accepted for Mistral/Qwen2 configs; see transformer.py

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_attention_heads, 1))
        self.validate()

    def validate(self) -> None:
        if self.model_type not in ARCHITECTURES:
            raise ConfigError(
                f"unsupported model_type {self.model_type!r}; meshrl supports {sorted(ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    # ---- HF config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict; unknown architectures raise ConfigError."""
        mt = d.get("model_type")
        archs = d.get("architectures") or []
        if mt not in ARCHITECTURES:
            raise ConfigError(
                f"unsupported architecture: model_type={mt!r} architectures={archs}; "
                f"meshrl supports {sorted(ARCHITECTURES.values())}"
            )
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise ConfigError(f"config.json lacks required keys {missing}")
        rope_theta = d.get("rope_theta")
        if rope_theta is None:  # transformers>=5 nests it under rope_parameters
            rope_theta = (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        scaling = d.get("rope_scaling") or (d.get("rope_parameters") or {})
        if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise ConfigError(f"unsupported rope scaling {scaling}; only default rotary embeddings")
        eos = d.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0]
        sw = d.get("sliding_window") if d.get("use_sliding_window", mt == "mistral") else None
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
            head_dim=d.get("head_dim") or 0,
            rope_theta=float(rope_theta),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", mt == "qwen2")),
            model_type=mt,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=d.get("pad_token_id"),
            sliding_window=sw,
        )

    def to_hf_dict(self) -> dict:
        d = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "float32",
        }
        if self.model_type == "llama":
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = False
        if self.model_type in ("qwen2", "mistral"):
            d["sliding_window"] = self.sliding_window
        if self.model_type == "qwen2":
            d["use_sliding_window"] = self.sliding_window is not None
        return d


def param_shapes(cfg: ModelConfig, value_head: bool = False) -> dict[str, tuple[int, ...]]:
    """HF parameter name -> shape, in module order. ``value_head`` swaps lm_head for ``score``
    (one scalar per token, shape [1, hidden]) as in HF's ``*ForTokenClassification`` heads."""
    h, q, kv, f = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        if cfg.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q,)
            shapes[p + "self_attn.k_proj.bias"] = (kv,)
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (f, h)
        shapes[p + "mlp.up_proj.weight"] = (f, h)
        shapes[p + "mlp.down_proj.weight"] = (h, f)
    shapes["model.norm.weight"] = (h,)
    if value_head:
        shapes["score.weight"] = (1, h)
    elif not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def num_params(cfg: ModelConfig, value_head: bool = False) -> int:
    total = 0
    for shape in param_shapes(cfg, value_head).values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total
