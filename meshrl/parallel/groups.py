"""Process groups for a placement, created once per rank and cached by their tuple of global ranks.

Several placements (meshes overlapping or disjoint) live in one world, so groups are never module
globals: a :class:`GroupCache` is made by the caller (one per process, or one per run) and the
:class:`RankGroups` it returns is passed explicitly into every parallel function.

Creation rule (found on gloo with torch 2.13): every rank of the world calls ``for_placement`` for
every placement, in the same order, including placements whose mesh does not contain it (it gets
None back). ``dist.new_group`` without local synchronisation is meant to be called by the whole world
and names a group by the count of groups the calling process made before (non-members count too),
so this is what keeps the names in step (``make`` is that one collective step, per group).
``use_local_synchronization=True`` (only members call) does not do: it names a group by its ranks *plus the
number of groups the calling rank already has*, so members that made different numbers of groups
before (e.g. ranks 0-1 after a dp2@0-1 placement, ranks 2-3 fresh) compute different names and the
creation times out. ``for_placement`` creates all of a placement's groups eagerly in a fixed order
(dp, tp, pp, mp, kv, tied; each axis's groups in rank order); nothing creates a group lazily inside a
forward or a step, so ranks that walk the same (SPMD) list of placements never deadlock.

Keep one cache per process for its whole life: on gloo destroying a group and creating the same
ranks' group again times out; the cache makes every group exactly once.

Size-one axes get no process group at all: every collective on them is a no-op, so dp=tp=pp=1
costs nothing over the plain model.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

from ..errors import UserError
from ..layout.mesh import Placement
from . import comm


@dataclass(frozen=True)
class Axis:
    """One communication axis as seen from this rank: the member ranks (global, in coordinate
    order), this rank's index among them, and the process group (None when there is one member)."""

    ranks: tuple[int, ...]
    index: int
    group: dist.ProcessGroup | None

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == len(self.ranks) - 1


@dataclass(frozen=True)
class RankGroups:
    """Everything one rank needs to run its part of a placement.

    dp / tp / pp: the rank's groups along each axis. mp ("model parallel"): the tp x pp ranks that
    share this rank's dp index, over which a gradient norm is summed. kv: the tp ranks that hold the
    same KV head when tp > KV heads (their k/v gradients are partial sums). tied: the first and last
    pipeline stage of this (dp, tp) column, which both hold a tied embedding (None otherwise)."""

    placement: Placement
    rank: int
    dp: Axis
    tp: Axis
    pp: Axis
    mp: Axis
    kv: Axis
    tied: Axis | None

    @property
    def coords(self) -> tuple[int, int, int]:
        return self.dp.index, self.tp.index, self.pp.index


class GroupCache:
    """Process groups keyed by their sorted tuple of global ranks; see the module docstring."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}

    def make(self, ranks: tuple[int, ...]) -> None:
        """Collective over the world: every rank calls it for every group, in the same order (and
        remembers it, None on non-members, so no rank makes it again)."""
        key = tuple(sorted(ranks))
        if len(key) > 1 and key not in self._groups:
            g = comm.new_group(list(key), self.timeout)
            self._groups[key] = g if dist.get_rank() in key else None

    def _axis(self, ranks: tuple[int, ...]) -> Axis:
        group = self._groups[tuple(sorted(ranks))] if len(ranks) > 1 else None
        return Axis(ranks, ranks.index(dist.get_rank()), group)

    def for_placement(self, placement: Placement, num_kv_heads: int | None = None) -> RankGroups | None:
        """Create (or reuse) all groups of ``placement``; return this rank's, or None if the rank is
        outside the mesh. Every rank of the world must call this, in the same order (see above).
        ``num_kv_heads`` enables the kv axis."""
        if not dist.is_initialized():
            raise UserError("torch.distributed is not initialised; start ranks with meshrl.runtime.launch")
        placement.mesh.check_world(dist.get_world_size())
        axes = all_axes(placement, num_kv_heads)
        for kind in ("dp", "tp", "pp", "mp", "kv", "tied"):
            for ranks in axes[kind]:
                self.make(ranks)
        rank = dist.get_rank()
        if rank not in placement.mesh:
            return None
        mine = {kind: next((r for r in axes[kind] if rank in r), None) for kind in axes}
        return RankGroups(placement, rank, *(self._axis(mine[k]) for k in ("dp", "tp", "pp", "mp", "kv")),
                          self._axis(mine["tied"]) if mine["tied"] else None)


def all_axes(placement: Placement, num_kv_heads: int | None) -> dict[str, list[tuple[int, ...]]]:
    """Every group of every axis of ``placement`` (tuples of global ranks in coordinate order)."""
    lay, r = placement.layout, placement.rank_of
    out = {a: placement.groups(a) for a in ("dp", "tp", "pp")}
    out["mp"] = [tuple(r(d, t, p) for p in range(lay.pp) for t in range(lay.tp)) for d in range(lay.dp)]
    rep = lay.tp // num_kv_heads if num_kv_heads is not None and lay.tp > num_kv_heads else 1
    out["kv"] = [tuple(r(d, h * rep + j, p) for j in range(rep))
                 for p in range(lay.pp) for d in range(lay.dp) for h in range(lay.tp // rep)]
    out["tied"] = [(g[0], g[-1]) for g in out["pp"]] if lay.pp > 1 else []
    return out
