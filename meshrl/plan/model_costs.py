"""Per-model numbers the estimator needs: parameters per stage, FLOPs per token, bytes per token.

Derived from ``param_shapes`` (the same HF names the checkpoint and ShardMap use), so a preset's
costs follow its real shapes (GQA, tied embeddings, value heads) rather than a ``12 h^2`` rule.

Mixture of experts: memory holds every expert (``layer_params``), a token computes with its top-k
(``layer_active_params``); both are averages over the layers, since Qwen3-MoE may mix dense and
sparse layers. Experts are sharded over tp (docs/parallel.md), so the MoE block's communication is
the tp all-reduce a dense MLP has (no all-to-all): the estimator's tp term covers it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..model.config import ModelConfig, active_params, num_params, param_shapes

BF16 = 2  # bytes per parameter / activation element in mixed precision


@dataclass(frozen=True)
class ModelCosts:
    cfg: ModelConfig
    value_head: bool
    layer_params: int  # one decoder layer (the mean over layers; every expert counted)
    embed_params: int
    head_params: int  # lm_head (or the tied embedding's copy on the last stage) or the value head
    final_norm: int
    layer_tensors: int = 9  # parameter tensors of one decoder layer
    layer_active_params: int = 0  # what one token computes with in a layer (top-k experts); 0: = layer_params

    def __post_init__(self) -> None:
        if not self.layer_active_params:
            object.__setattr__(self, "layer_active_params", self.layer_params)

    def stage_tensors(self, pp: int) -> int:
        """Parameter tensors on the largest pipeline stage: its layers', plus embedding, norm, head."""
        return -(-self.cfg.num_hidden_layers // pp) * self.layer_tensors + 3

    @property
    def total_params(self) -> int:
        tied = self.cfg.tie_word_embeddings and not self.value_head
        return (self.cfg.num_hidden_layers * self.layer_params + self.embed_params + self.final_norm
                + (0 if tied else self.head_params))

    def stage_params(self, layers: int, first: bool, last: bool, pp: int) -> int:
        """Parameters held by one pipeline stage (before TP sharding). With tied embeddings and pp>1
        the last stage keeps its own copy of the embedding as the head (as Megatron does)."""
        n = layers * self.layer_params
        if first:
            n += self.embed_params
        if last:
            n += self.final_norm
            tied = self.cfg.tie_word_embeddings and not self.value_head
            if not tied or pp > 1 or not first:
                n += self.head_params
        return n

    def max_stage_params(self, pp: int) -> int:
        L = self.cfg.num_hidden_layers
        base, extra = divmod(L, pp)
        best = 0
        for s in range(pp):
            layers = base + (1 if s < extra else 0)
            best = max(best, self.stage_params(layers, s == 0, s == pp - 1, pp))
        return best

    def matmul_flops_per_token(self) -> float:
        """Forward FLOPs per token outside attention scores: 2 x every matmul weight (embedding
        lookups are gathers, not matmuls)."""
        return 2.0 * (self.cfg.num_hidden_layers * self.layer_active_params + self.head_params)

    def attn_flops(self, new_tokens: int, context: int) -> float:
        """Forward FLOPs of QK^T and AV for ``new_tokens`` tokens attending (causally) to a
        context that ends at ``context``: 4 * q_size per (query, key) pair per layer."""
        start = context - new_tokens
        pairs = new_tokens * start + new_tokens * (new_tokens + 1) / 2
        return 4.0 * self.cfg.q_size * pairs * self.cfg.num_hidden_layers

    def kv_bytes_per_token(self, tp: int, dtype_bytes: int = BF16) -> float:
        """KV cache bytes per token per layer on one TP rank (KV heads are replicated when tp
        exceeds them, so a rank holds at least one)."""
        heads = max(1, self.cfg.num_key_value_heads // tp)
        return 2 * heads * self.cfg.head_dim * dtype_bytes

    def act_bytes_per_token_layer(self, tp: int, dtype_bytes: int = BF16) -> float:
        """Activation memory kept for backward per token per layer: Korthikanti et al. 2022
        ("Reducing Activation Recomputation in Large Transformer Models", eq. 2 with tensor
        parallelism) h * (10 + 24/t) bytes, without the 5*a*s/h score term that FlashAttention
        (Dao et al. 2022) never stores."""
        return self.cfg.hidden_size * (10 + 24 / tp) * dtype_bytes / BF16

    @property
    def out_width(self) -> int:
        """Width of the output head: the vocabulary, or 1 for a value head."""
        return 1 if self.value_head else self.cfg.vocab_size


@lru_cache(maxsize=256)
def model_costs(cfg: ModelConfig, value_head: bool = False) -> ModelCosts:
    shapes = param_shapes(cfg, value_head)

    def size(shape: tuple[int, ...]) -> int:
        n = 1
        for s in shape:
            n *= s
        return n

    layers = cfg.num_hidden_layers
    layer = sum(size(s) for k, s in shapes.items() if k.startswith("model.layers.")) // layers
    active = layer - (num_params(cfg, value_head) - active_params(cfg, value_head)) // layers
    embed = size(shapes["model.embed_tokens.weight"])
    if value_head:
        head = size(shapes["score.weight"])
    else:
        head = cfg.vocab_size * cfg.hidden_size
    tensors = -(-sum(1 for k in shapes if k.startswith("model.layers.")) // layers)
    return ModelCosts(cfg, value_head, layer, embed, head, size(shapes["model.norm.weight"]), tensors, active)
