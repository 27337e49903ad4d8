"""``ReallocPlan``: the transfers that turn one ShardMap into another. Pure, no torch.

For every parameter and every destination rank, the destination slice is cut by the *distinct*
source slices (within one layout, held slices are equal or disjoint: DP replicas, replicated KV
heads and a tied head hold equal ones). Each intersection is then

- copied locally, when the destination rank holds that source slice itself (no bytes move); or
- sent by the source ranks that hold it, split into near-equal row blocks, one per holder, so
  the sending load is spread evenly over the replicas (ReaL picks one sender per pair instead).

Intersections are general boxes, so TP and PP sizes that do not divide each other work
(tp3 -> tp2, pp3 -> pp2). Every destination element comes from exactly one source.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..model.config import ModelConfig
from ..parallel.mesh import Placement
from .shardmap import ShardMap, Slice, intersect, shard_map, slice_numel


@dataclass(frozen=True)
class Transfer:
    """``region`` of the full tensor ``name`` goes from ``src`` to ``dst`` (src == dst: local copy)."""

    name: str
    src: int
    dst: int
    region: Slice
    nbytes: int


@dataclass
class ReallocPlan:
    """Transfers (src != dst) and local copies (src == dst) that build the destination ShardMap."""

    src: ShardMap
    dst: ShardMap
    dtype_bytes: int
    transfers: list[Transfer] = field(default_factory=list)
    copies: list[Transfer] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Bytes that cross a link (local copies excluded)."""
        return sum(t.nbytes for t in self.transfers)

    def link_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes per (src_rank, dst_rank) link, local copies excluded."""
        out: Counter[tuple[int, int]] = Counter()
        for t in self.transfers:
            out[(t.src, t.dst)] += t.nbytes
        return dict(out)

    def sent_by(self) -> dict[int, int]:
        """Bytes each source rank sends."""
        out: Counter[int] = Counter()
        for t in self.transfers:
            out[t.src] += t.nbytes
        return dict(out)

    def for_rank(self, rank: int) -> tuple[list[Transfer], list[Transfer], list[Transfer]]:
        """(sends, receives, local copies) of one rank, each in plan order."""
        sends = [t for t in self.transfers if t.src == rank]
        recvs = [t for t in self.transfers if t.dst == rank]
        return sends, recvs, [t for t in self.copies if t.dst == rank]


def _split(region: Slice, parts: int) -> list[Slice]:
    """Cut a box into up to ``parts`` near-equal blocks (empty blocks dropped): along dim 0 when it
    has enough rows, since row blocks of a row-major tensor are contiguous and travel without a copy;
    else along the longest dim."""
    dim = 0 if region and region[0][1] - region[0][0] >= parts else \
        max(range(len(region)), key=lambda d: region[d][1] - region[d][0])
    lo, hi = region[dim]
    base, extra = divmod(hi - lo, parts)
    out, start = [], lo
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        if n:
            out.append(region[:dim] + ((start, start + n),) + region[dim + 1:])
        start += n
    return out


def plan_param(name: str, src_holders: list[tuple[int, Slice]], dst_holders: list[tuple[int, Slice]],
               itemsize: int) -> tuple[list[Transfer], list[Transfer]]:
    """Transfers and local copies that build every destination slice of one parameter.

    ``src_holders`` / ``dst_holders``: (rank, slice) as ShardMap.holders gives them. Raises
    ValueError if the source slices do not cover a destination slice exactly once."""
    groups: dict[Slice, list[int]] = {}
    for rank, s in src_holders:
        groups.setdefault(s, []).append(rank)
    transfers: list[Transfer] = []
    copies: list[Transfer] = []
    for i, (dst, dslice) in enumerate(dst_holders):
        covered = 0
        for sslice, ranks in groups.items():
            box = intersect(dslice, sslice)
            if box is None:
                continue
            n = slice_numel(box)
            covered += n
            if dst in ranks:
                copies.append(Transfer(name, dst, dst, box, n * itemsize))
                continue
            # Rotate the first sender with the destination index so that remainder rows spread too.
            k = len(ranks)
            for j, part in enumerate(_split(box, k)):
                src = ranks[(i + j) % k]
                transfers.append(Transfer(name, src, dst, part, slice_numel(part) * itemsize))
        if covered != slice_numel(dslice):
            raise ValueError(f"source slices of {name} cover {covered} of the {slice_numel(dslice)} elements "
                             f"rank {dst} needs: the two shard maps do not describe the same tensor")
    return transfers, copies


def _check_same_model(src: ShardMap, dst: ShardMap) -> None:
    if src.shapes != dst.shapes:
        raise ValueError("cannot reallocate between shard maps of different models (parameter shapes differ)")


def realloc_plan(src: ShardMap, dst: ShardMap, dtype_bytes: int = 2) -> ReallocPlan:
    """The full plan (every parameter, every rank) from ``src`` to ``dst``."""
    _check_same_model(src, dst)
    plan = ReallocPlan(src, dst, dtype_bytes)
    for name in src.shapes:
        t, c = plan_param(name, src.holders(name), dst.holders(name), dtype_bytes)
        plan.transfers.extend(t)
        plan.copies.extend(c)
    return plan


def _layer_groups(src: ShardMap, dst: ShardMap) -> dict[tuple[int, int], list[int]]:
    """Layers grouped by (source stage, destination stage): every layer of a group moves alike."""
    out: dict[tuple[int, int], list[int]] = {}
    for i in range(src.cfg.num_hidden_layers):
        name = f"model.layers.{i}.input_layernorm.weight"
        out.setdefault((src.stages_of(name)[0], dst.stages_of(name)[0]), []).append(i)
    return out


def link_bytes(cfg: ModelConfig, src: Placement, dst: Placement, value_head: bool = False,
               dtype_bytes: int = 2) -> dict[tuple[int, int], int]:
    """Bytes per (src_rank, dst_rank) link to move ``cfg`` from ``src`` to ``dst``; local copies excluded.

    Equal to ``realloc_plan(...).link_bytes()`` but fast enough for a plan search: layers whose
    (source stage, destination stage) pair is the same move identically, so each parameter kind is
    planned once per pair and scaled by the number of layers in it."""
    s, d = shard_map(cfg, src, value_head), shard_map(cfg, dst, value_head)
    out: Counter[tuple[int, int]] = Counter()

    def add(name: str, times: int) -> None:
        transfers, _ = plan_param(name, s.holders(name), d.holders(name), dtype_bytes)
        for t in transfers:
            out[(t.src, t.dst)] += t.nbytes * times

    layer0 = [n.split(".", 3)[3] for n in s.shapes if n.startswith("model.layers.0.")]
    for layers in _layer_groups(s, d).values():
        for kind in layer0:
            add(f"model.layers.{layers[0]}.{kind}", len(layers))
    for name in s.shapes:
        if not name.startswith("model.layers."):
            add(name, 1)
    return dict(out)
