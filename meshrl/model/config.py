"""Model configuration for the decoder families meshrl runs, and pure shape math.

Families: LLaMA (incl. Llama 3.x RoPE scaling), Qwen2, Mistral, Qwen3 (per-head q/k RMSNorm),
and the Mixture-of-Experts families Qwen3-MoE and Mixtral. Parameter names follow Hugging Face's
checkpoint files exactly (``model.layers.3.self_attn.q_proj.weight``,
``model.layers.3.mlp.experts.5.up_proj.weight``), so that checkpoint I/O is a rename-free copy and
the planner's ShardMap speaks the same names as the checkpoint on disk. Nothing here touches
torch: the planner imports it to size 70B models. config.json reading/writing is in hf_config.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import UserError

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
MOE_FAMILIES = ("qwen3_moe", "mixtral")
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


class ConfigError(UserError, ValueError):
    """A model configuration that cannot be built; the message names the culprit."""


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding scaling as transformers defines it (modeling_rope_utils.py); None fields
    take transformers' defaults (see model/rope.py, which computes the frequencies)."""

    rope_type: str  # linear | dynamic | yarn | llama3
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    beta_fast: float | None = None  # yarn
    beta_slow: float | None = None  # yarn
    attention_factor: float | None = None  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool | None = None  # yarn

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


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
    model_type: str = "llama"  # one of ARCHITECTURES
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    pad_token_id: int | None = None
    sliding_window: int | None = None  # accepted for Mistral/Qwen2 configs; see transformer.py
    rope_scaling: RopeScaling | None = None  # None: plain rotary embeddings
    # How config.json spelled the rotary settings, so export writes them back the same way:
    # "rope_scaling" (transformers 4: top-level rope_theta + rope_scaling) or "rope_parameters" (5).
    rope_format: str = "rope_scaling"
    # Mixture of experts (num_experts = 0: every layer has a dense MLP)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's MLP width (Mixtral: intermediate_size)
    norm_topk_prob: bool = True  # renormalise the top-k router probabilities (Mixtral always does)
    decoder_sparse_step: int = 1  # Qwen3-MoE: layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here
    router_aux_loss_coef: float = 0.001  # kept to write config.json back; training uses ppo.moe_aux_coef

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_attention_heads, 1))
        if self.model_type == "mixtral" and self.moe_intermediate_size == 0:
            object.__setattr__(self, "moe_intermediate_size", self.intermediate_size)
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
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
        if self.rope_scaling is not None and self.rope_scaling.rope_type not in ROPE_TYPES[1:]:
            raise ConfigError(f"unsupported rope scaling type {self.rope_scaling.rope_type!r}; "
                              f"meshrl supports {list(ROPE_TYPES)}")
        if self.rope_format not in ("rope_scaling", "rope_parameters"):
            raise ConfigError(f"rope_format must be 'rope_scaling' or 'rope_parameters', got {self.rope_format!r}")
        if (self.model_type in MOE_FAMILIES) != (self.num_experts > 0):
            raise ConfigError(f"model_type {self.model_type!r} with num_experts={self.num_experts}: the "
                              f"mixture-of-experts families {list(MOE_FAMILIES)} need num_experts > 0, "
                              "the others 0")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                              f"1..num_experts={self.num_experts}")
        if self.model_type == "mixtral" and self.moe_intermediate_size != self.intermediate_size:
            raise ConfigError(f"mixtral experts are intermediate_size={self.intermediate_size} wide, "
                              f"but moe_intermediate_size={self.moe_intermediate_size}")
        if self.num_experts and (self.moe_intermediate_size <= 0 or self.decoder_sparse_step <= 0):
            raise ConfigError("moe_intermediate_size and decoder_sparse_step must be positive, got "
                              f"{self.moe_intermediate_size} and {self.decoder_sparse_step}")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def qk_norm(self) -> bool:
        """Qwen3: RMSNorm over head_dim on every query and key head, before the rotation."""
        return self.model_type in QK_NORM_FAMILIES

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` has a sparse MoE block (Qwen3-MoE's rule; Mixtral: every layer)."""
        return (self.num_experts > 0 and i not in self.mlp_only_layers
                and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def moe_prefix(self) -> str:
        """The MoE block's module name inside a layer, as HF's checkpoints spell it."""
        return "block_sparse_moe" if self.model_type == "mixtral" else "mlp"

    @property
    def expert_names(self) -> tuple[str, str, str]:
        """(gate, up, down) projection names inside one expert, as HF's checkpoints spell them."""
        return ("w1", "w3", "w2") if self.model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


def layer_param_shapes(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer ``i``'s parameter names (HF, prefix ``model.layers.i.``) -> shape, in module order."""
    h, q, kv, f = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    p = f"model.layers.{i}."
    shapes = {p + "input_layernorm.weight": (h,),
              p + "self_attn.q_proj.weight": (q, h),
              p + "self_attn.k_proj.weight": (kv, h),
              p + "self_attn.v_proj.weight": (kv, h)}
    if cfg.attention_bias:
        shapes[p + "self_attn.q_proj.bias"] = (q,)
        shapes[p + "self_attn.k_proj.bias"] = (kv,)
        shapes[p + "self_attn.v_proj.bias"] = (kv,)
    shapes[p + "self_attn.o_proj.weight"] = (h, q)
    if cfg.qk_norm:
        shapes[p + "self_attn.q_norm.weight"] = (cfg.head_dim,)
        shapes[p + "self_attn.k_norm.weight"] = (cfg.head_dim,)
    shapes[p + "post_attention_layernorm.weight"] = (h,)
    if cfg.is_moe_layer(i):
        m, fe = p + cfg.moe_prefix + ".", cfg.moe_intermediate_size
        gate, up, down = cfg.expert_names
        shapes[m + "gate.weight"] = (cfg.num_experts, h)
        for e in range(cfg.num_experts):
            shapes[f"{m}experts.{e}.{gate}.weight"] = (fe, h)
            shapes[f"{m}experts.{e}.{up}.weight"] = (fe, h)
            shapes[f"{m}experts.{e}.{down}.weight"] = (h, fe)
    else:
        shapes[p + "mlp.gate_proj.weight"] = (f, h)
        shapes[p + "mlp.up_proj.weight"] = (f, h)
        shapes[p + "mlp.down_proj.weight"] = (h, f)
    return shapes


def param_shapes(cfg: ModelConfig, value_head: bool = False) -> dict[str, tuple[int, ...]]:
    """HF parameter name -> shape, in module order. ``value_head`` swaps lm_head for ``score``
    (one scalar per token, shape [1, hidden]) as in HF's ``*ForTokenClassification`` heads."""
    h = cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_hidden_layers):
        shapes.update(layer_param_shapes(cfg, i))
    shapes["model.norm.weight"] = (h,)
    if value_head:
        shapes["score.weight"] = (1, h)
    elif not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def num_params(cfg: ModelConfig, value_head: bool = False) -> int:
    """All parameters (every expert counted): what memory holds."""
    return sum(_numel(s) for s in param_shapes(cfg, value_head).values())


def active_params(cfg: ModelConfig, value_head: bool = False) -> int:
    """Parameters one token computes with: ``num_params`` less the experts it is not routed to
    (top-k of E in every MoE layer). Equal to ``num_params`` for a dense model."""
    if not cfg.num_experts:
        return num_params(cfg, value_head)
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    return num_params(cfg, value_head) - moe_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert
