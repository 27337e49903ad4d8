"""Hugging Face ``config.json`` <-> ModelConfig, for every family meshrl runs. Pure (no torch).

Rotary settings come in two spellings: transformers 4 writes a top-level ``rope_theta`` plus a
``rope_scaling`` dict (or null); transformers 5 writes one ``rope_parameters`` dict holding
``rope_theta`` and the scaling keys. Both are read; ``ModelConfig.rope_format`` remembers which one
a checkpoint used, and export writes the same one back.
"""

from __future__ import annotations

from .config import ARCHITECTURES, MOE_FAMILIES, ROPE_TYPES, ConfigError, ModelConfig, RopeScaling

_SCALING_KEYS = ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                 "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate")
_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def _rope(d: dict) -> tuple[float, RopeScaling | None, str]:
    """-> (rope_theta, scaling or None, the spelling config.json used)."""
    params = d.get("rope_parameters")
    if isinstance(params, dict) and params:
        fmt, scaling = "rope_parameters", dict(params)
        theta = d.get("rope_theta") or params.get("rope_theta") or 10000.0
    else:
        fmt, scaling = "rope_scaling", dict(d.get("rope_scaling") or {})
        theta = d.get("rope_theta") or 10000.0
    if any(isinstance(v, dict) for v in scaling.values()):
        raise ConfigError(f"per-layer-type rotary parameters {scaling} are not supported")
    if float(scaling.get("partial_rotary_factor", d.get("partial_rotary_factor") or 1.0)) != 1.0:
        raise ConfigError("partial_rotary_factor != 1 is not supported (rotary embeddings cover the whole head)")
    kind = scaling.get("rope_type", scaling.get("type")) or "default"
    if kind not in ROPE_TYPES:
        raise ConfigError(f"unsupported rope scaling type {kind!r} in {scaling}; meshrl supports {list(ROPE_TYPES)}")
    if kind == "default":
        return float(theta), None, fmt
    lacking = [k for k in _REQUIRED[kind] if k not in scaling]
    if lacking:
        raise ConfigError(f"rope scaling {kind!r} lacks {lacking} in {scaling}")
    # transformers lets a top-level original_max_position_embeddings win (Phi-3 style configs)
    if kind in ("llama3", "yarn") and d.get("original_max_position_embeddings"):
        scaling["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    kw = {k: scaling[k] for k in _SCALING_KEYS if scaling.get(k) is not None}
    return float(theta), RopeScaling(rope_type=kind, **kw), fmt


def _moe(d: dict, mt: str) -> dict:
    if mt not in MOE_FAMILIES:
        return {}
    if mt == "mixtral":
        return dict(num_experts=d.get("num_local_experts", 8), num_experts_per_tok=d.get("num_experts_per_tok", 2),
                    moe_intermediate_size=d["intermediate_size"], norm_topk_prob=True,
                    router_aux_loss_coef=d.get("router_aux_loss_coef", 0.001))
    experts = d.get("num_experts") or d.get("num_local_experts")  # transformers 5 writes the latter
    if not experts or "moe_intermediate_size" not in d:
        raise ConfigError("a qwen3_moe config.json needs num_experts (or num_local_experts) and moe_intermediate_size")
    return dict(num_experts=experts, num_experts_per_tok=d.get("num_experts_per_tok", 8),
                moe_intermediate_size=d["moe_intermediate_size"],
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                decoder_sparse_step=d.get("decoder_sparse_step", 1),
                mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
                router_aux_loss_coef=d.get("router_aux_loss_coef", 0.001))


def _sliding_window(d: dict, mt: str) -> int | None:
    if mt in ("qwen3", "qwen3_moe"):
        if d.get("use_sliding_window"):  # per-layer windows from max_window_layers: not modelled
            raise ConfigError(f"{mt} with use_sliding_window=true is not supported")
        return None
    if mt == "qwen2":
        return d.get("sliding_window") if d.get("use_sliding_window") else None
    return d.get("sliding_window")  # mistral, mixtral (and llama has none)


def config_from_hf(d: dict) -> ModelConfig:
    """A ModelConfig from a Hugging Face ``config.json`` dict; anything unsupported raises ConfigError."""
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
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"hidden_act={act!r} is not supported (SwiGLU MLPs use silu)")
    bias = bool(d.get("attention_bias", mt == "qwen2"))
    if bias and mt not in ("qwen2", "llama"):
        raise ConfigError(f"{mt} with attention_bias=true is not supported")
    theta, scaling, fmt = _rope(d)
    eos = d.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    return ModelConfig(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        head_dim=d.get("head_dim") or 0,
        rope_theta=theta,
        rms_norm_eps=d.get("rms_norm_eps", 1e-6),
        max_position_embeddings=d.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=bias,
        model_type=mt,
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=eos,
        pad_token_id=d.get("pad_token_id"),
        sliding_window=_sliding_window(d, mt),
        rope_scaling=scaling,
        rope_format=fmt,
        **_moe(d, mt),
    )


def _rope_to_hf(cfg: ModelConfig) -> dict:
    scaling = {} if cfg.rope_scaling is None else cfg.rope_scaling.to_dict()
    if cfg.rope_format == "rope_parameters":
        return {"rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default", **scaling}}
    return {"rope_theta": cfg.rope_theta, "rope_scaling": scaling or None}


def _family_to_hf(cfg: ModelConfig) -> dict:
    mt = cfg.model_type
    if mt == "llama":
        return {"attention_bias": cfg.attention_bias, "mlp_bias": False}
    if mt == "mistral":
        return {"sliding_window": cfg.sliding_window}
    if mt == "qwen2":
        return {"sliding_window": cfg.sliding_window, "use_sliding_window": cfg.sliding_window is not None}
    if mt == "mixtral":
        return {"sliding_window": cfg.sliding_window, "num_local_experts": cfg.num_experts,
                "num_experts_per_tok": cfg.num_experts_per_tok, "router_aux_loss_coef": cfg.router_aux_loss_coef}
    d = {"attention_bias": False, "use_sliding_window": False, "sliding_window": None}  # qwen3, qwen3_moe
    if mt == "qwen3_moe":
        d.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                 moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
                 decoder_sparse_step=cfg.decoder_sparse_step, mlp_only_layers=list(cfg.mlp_only_layers),
                 router_aux_loss_coef=cfg.router_aux_loss_coef)
    return d


def config_to_hf(cfg: ModelConfig) -> dict:
    """The config.json dict transformers reads back into the same model."""
    d = {
        "architectures": [ARCHITECTURES[cfg.model_type]],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        **_rope_to_hf(cfg),
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": "float32",
    }
    d.update(_family_to_hf(cfg))
    return d
