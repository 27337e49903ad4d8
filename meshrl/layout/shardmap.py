"""``ShardMap``: which slice of every parameter each rank holds under a placement. Pure, no torch.

This is the one definition of the sharding: the parallel model cuts its local shards out of full
tensors with it, and the reallocation planner derives transfers from two of them.

Rules (HF parameter names; a slice is (start, stop) per dim):
- PP: layers split by ``stage_layers``. Stage 0 holds the embedding; the last stage holds the final
  norm and the head (``lm_head`` or a value model's ``score``). With tied embeddings and pp > 1 the
  last stage also holds ``model.embed_tokens.weight``, as its head.
- TP column-parallel (dim 0 in tp contiguous chunks): q_proj (weight, bias), gate_proj, up_proj,
  the embedding and lm_head (vocabulary-parallel).
- k_proj / v_proj: split like q when kv_heads >= tp; when tp > kv_heads the KV heads are
  replicated, and tp rank t holds KV head t // (tp // kv_heads): the one its query heads use.
- TP row-parallel (dim 1): o_proj, down_proj. Norms (Qwen3's q_norm/k_norm too), MoE routers
  (``gate``) and ``score`` are replicated.
- Experts (``...experts.e.*``) are whole tensors sharded over tp: tp rank t holds experts
  t*E/tp .. (t+1)*E/tp - 1 of every MoE layer (docs/parallel.md, "Experts").
- DP replicas hold the same slices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.config import ModelConfig, param_shapes
from .mesh import LayoutError, Placement, stage_layers

Slice = tuple[tuple[int, int], ...]

_COLUMN = ("self_attn.q_proj.", "mlp.gate_proj.", "mlp.up_proj.")
_ROW = ("self_attn.o_proj.", "mlp.down_proj.")
_KV = ("self_attn.k_proj.", "self_attn.v_proj.")


def check_shardable(cfg: ModelConfig, placement: Placement) -> None:
    """Raise LayoutError if ``placement`` cannot shard ``cfg`` under the rules above."""
    tp, pp, kv = placement.layout.tp, placement.layout.pp, cfg.num_key_value_heads
    for what, n in (("attention heads", cfg.num_attention_heads), ("intermediate size", cfg.intermediate_size),
                    ("vocabulary size", cfg.vocab_size)):
        if n % tp:
            raise LayoutError(f"tp={tp} does not divide the model's {what} ({n})")
    if cfg.num_experts % tp:
        raise LayoutError(f"tp={tp} does not divide the model's {cfg.num_experts} experts per layer")
    if kv % tp and tp % kv:
        raise LayoutError(f"tp={tp} and the model's {kv} KV heads do not divide one another")
    if pp > cfg.num_hidden_layers:
        raise LayoutError(f"pp={pp} is larger than the model's {cfg.num_hidden_layers} layers")


def expert_of(name: str) -> int | None:
    """The expert id in ``model.layers.i.<moe>.experts.e.<proj>.weight``, else None."""
    parts = name.split(".")
    return int(parts[5]) if len(parts) > 6 and parts[4] == "experts" else None


def _chunk(n: int, parts: int, idx: int) -> tuple[int, int]:
    size = n // parts
    return idx * size, (idx + 1) * size


@dataclass
class ShardMap:
    cfg: ModelConfig
    placement: Placement
    value_head: bool = False
    shapes: dict[str, tuple[int, ...]] = field(init=False)
    _stage_of_layer: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_shardable(self.cfg, self.placement)
        self.shapes = param_shapes(self.cfg, self.value_head)
        self._stage_of_layer = [0] * self.cfg.num_hidden_layers
        for s, layers in enumerate(stage_layers(self.cfg.num_hidden_layers, self.placement.layout.pp)):
            for i in layers:
                self._stage_of_layer[i] = s

    # ---- which stage holds a parameter ----------------------------------------------------
    def stages_of(self, name: str) -> tuple[int, ...]:
        last = self.placement.layout.pp - 1
        if name.startswith("model.layers."):
            return (self._stage_of_layer[int(name.split(".")[2])],)
        if name == "model.embed_tokens.weight":
            tied_head = self.cfg.tie_word_embeddings and not self.value_head
            return (0, last) if tied_head and last > 0 else (0,)
        if name in ("model.norm.weight", "lm_head.weight", "score.weight"):
            return (last,)
        raise KeyError(f"unknown parameter {name!r}")

    # ---- the slice a TP rank holds ---------------------------------------------------------
    def tp_slice(self, name: str, tp_idx: int) -> Slice | None:
        """Slice of the full parameter held by TP rank ``tp_idx`` (the same on every dp/pp coordinate);
        None for an expert that another tp rank holds."""
        shape, tp = self.shapes[name], self.placement.layout.tp
        full = tuple((0, n) for n in shape)
        if tp == 1:
            return full
        inner = name.split(".", 3)[-1] if name.startswith("model.layers.") else name
        expert = expert_of(name)
        if expert is not None:  # whole experts, E/tp per tp rank
            return full if expert // (self.cfg.num_experts // tp) == tp_idx else None
        if name in ("model.embed_tokens.weight", "lm_head.weight") or inner.startswith(_COLUMN):
            return (_chunk(shape[0], tp, tp_idx),) + full[1:]
        if inner.startswith(_ROW):
            return (full[0], _chunk(shape[1], tp, tp_idx))
        if inner.startswith(_KV):
            kv = self.cfg.num_key_value_heads
            if kv >= tp:
                return (_chunk(shape[0], tp, tp_idx),) + full[1:]
            head, hd = tp_idx // (tp // kv), self.cfg.head_dim
            return ((head * hd, (head + 1) * hd),) + full[1:]
        return full  # norms, score

    # ---- queries ------------------------------------------------------------------------------
    def slice_of(self, rank: int, name: str) -> Slice | None:
        """The slice of ``name`` that global ``rank`` holds, or None."""
        if rank not in self.placement.mesh.ranks:
            return None
        _, tp_idx, pp_idx = self.placement.coords_of(rank)
        if pp_idx not in self.stages_of(name):
            return None
        return self.tp_slice(name, tp_idx)

    def params_of(self, rank: int) -> dict[str, Slice]:
        """Everything ``rank`` holds, in model order."""
        out = {}
        for name in self.shapes:
            s = self.slice_of(rank, name)
            if s is not None:
                out[name] = s
        return out

    def holders(self, name: str) -> list[tuple[int, Slice]]:
        """(rank, slice) for every rank of the mesh that holds part of ``name``, in mesh order."""
        out = []
        for rank in self.placement.mesh.ranks:
            s = self.slice_of(rank, name)
            if s is not None:
                out.append((rank, s))
        return out


def shard_map(cfg: ModelConfig, placement: Placement, value_head: bool = False) -> ShardMap:
    return ShardMap(cfg, placement, value_head)


def slice_numel(s: Slice) -> int:
    n = 1
    for a, b in s:
        n *= b - a
    return n


def intersect(a: Slice, b: Slice) -> Slice | None:
    """The overlap of two slices of the same tensor, or None."""
    out = []
    for (a0, a1), (b0, b1) in zip(a, b, strict=True):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)
