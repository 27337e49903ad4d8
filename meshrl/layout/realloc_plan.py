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

import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..model.config import ModelConfig
from .mesh import Placement
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


Move = tuple[int, int, Slice, int]  # (src rank, dst rank, region of the full tensor, elements)


def _moves(name: str, src_holders: list[tuple[int, Slice]], dst_holders: list[tuple[int, Slice]]
           ) -> Iterator[Move]:
    """Every move (src == dst: a local copy) that builds the destination slices of one parameter.

    The cuts depend only on the destination slice, so they are computed once per distinct slice
    (DP replicas share them); only the local-copy test and the sender rotation are per rank."""
    groups: dict[Slice, list[int]] = {}
    for rank, s in src_holders:
        groups.setdefault(s, []).append(rank)
    members = {s: set(r) for s, r in groups.items()}
    cuts: dict[Slice, list[tuple[Slice, Slice, int, list[tuple[Slice, int]]]]] = {}
    for i, (dst, dslice) in enumerate(dst_holders):
        if dslice not in cuts:
            cuts[dslice] = []
            for sslice, ranks in groups.items():
                box = intersect(dslice, sslice)
                if box is not None:
                    parts = [(p, slice_numel(p)) for p in _split(box, len(ranks))]
                    cuts[dslice].append((sslice, box, slice_numel(box), parts))
            covered = sum(n for _, _, n, _ in cuts[dslice])
            if covered != slice_numel(dslice):
                raise ValueError(f"source slices of {name} cover {covered} of the {slice_numel(dslice)} "
                                 f"elements rank {dst} needs: the shard maps do not describe one tensor")
        for sslice, box, n, parts in cuts[dslice]:
            if dst in members[sslice]:
                yield dst, dst, box, n
                continue
            # Rotate the first sender with the destination index so that remainder rows spread too.
            ranks = groups[sslice]
            for j, (part, pn) in enumerate(parts):
                yield ranks[(i + j) % len(ranks)], dst, part, pn


def plan_param(name: str, src_holders: list[tuple[int, Slice]], dst_holders: list[tuple[int, Slice]],
               itemsize: int) -> tuple[list[Transfer], list[Transfer]]:
    """Transfers and local copies that build every destination slice of one parameter.

    ``src_holders`` / ``dst_holders``: (rank, slice) as ShardMap.holders gives them. Each source
    slice's holders split what a destination lacks into near-equal row blocks, one per holder.
    Raises ValueError if the source slices do not cover a destination slice exactly once."""
    transfers: list[Transfer] = []
    copies: list[Transfer] = []
    for src, dst, region, n in _moves(name, src_holders, dst_holders):
        (copies if src == dst else transfers).append(Transfer(name, src, dst, region, n * itemsize))
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


def _layer_groups(src: ShardMap, dst: ShardMap) -> dict[tuple[int, int, bool], list[int]]:
    """Layers grouped by (source stage, destination stage, dense or MoE): every layer of a group
    moves alike."""
    out: dict[tuple[int, int, bool], list[int]] = {}
    for i in range(src.cfg.num_hidden_layers):
        name = f"model.layers.{i}.input_layernorm.weight"
        out.setdefault((src.stages_of(name)[0], dst.stages_of(name)[0], src.cfg.is_moe_layer(i)), []).append(i)
    return out


def _holders(sm: ShardMap, name: str) -> list[tuple[int, Slice]]:
    """``sm.holders(name)`` (same order, same slices) in O(mesh size): walks the local indices of the
    mesh instead of looking every rank up, and asks the ShardMap only for stages and TP slices."""
    lay, ranks = sm.placement.layout, sm.placement.mesh.ranks
    stages = sm.stages_of(name)
    by_tp = [sm.tp_slice(name, t) for t in range(lay.tp)]
    return [(ranks[i], by_tp[i % lay.tp]) for i in range(lay.size)
            if i // (lay.tp * lay.dp) in stages and by_tp[i % lay.tp] is not None]


def link_bytes(cfg: ModelConfig, src: Placement, dst: Placement, value_head: bool = False,
               dtype_bytes: int = 2) -> dict[tuple[int, int], int]:
    """Bytes per (src_rank, dst_rank) link to move ``cfg`` from ``src`` to ``dst``; local copies excluded.

    Equal to ``realloc_plan(...).link_bytes()`` but fast enough for a plan search: layers whose
    (source stage, destination stage) pair is the same move identically, so each parameter kind is
    planned once per pair and scaled by the number of layers in it; results are cached."""
    return dict(_link_bytes(cfg, src, dst, value_head, dtype_bytes))


@functools.lru_cache(maxsize=4096)  # a plan search asks for the same pairs again and again
def _link_bytes(cfg: ModelConfig, src: Placement, dst: Placement, value_head: bool,
                dtype_bytes: int) -> dict[tuple[int, int], int]:
    s, d = shard_map(cfg, src, value_head), shard_map(cfg, dst, value_head)
    out: Counter[tuple[int, int]] = Counter()

    def add(name: str, times: int) -> None:
        scale = dtype_bytes * times
        for a, b, _, n in _moves(name, _holders(s, name), _holders(d, name)):
            if a != b:
                out[(a, b)] += n * scale

    for layers in _layer_groups(s, d).values():
        first = f"model.layers.{layers[0]}."
        for name in (n for n in s.shapes if n.startswith(first)):
            add(name, len(layers))
    for name in s.shapes:
        if not name.startswith("model.layers."):
            add(name, 1)
    return dict(out)
