"""Which ranks of a plan do the same thing: the dry run simulates one rank per class, and checks it.

A rank's *signature* is what, in the runtime, decides the shapes it computes and sends and the
bytes it holds, step by step through one iteration (meshrl/plan/steps.py's order):

- a call: the rank's pipeline stage, the rows of its dp replica (a split by sequence count: under
  the dry run's worst case every row has the same length), the shapes of its own parameter shards
  (tp and pp slices), whether it holds the replica's output, reports the call's statistics, and
  which other roles' models it keeps (their memory is resident during the call);
- a reallocation: its rounds of buckets sent and received as the executor runs them (each piece's
  parameter and box shape), the shapes of its shards on both sides, and its local copies;
- a transfer: whether it sends, receives, and how many rows its part has.

Not in it: the dp index and the tp index themselves (they choose *which* rows and *which* slice,
not their shapes) and the identity of peers. That is the symmetry argument: two ranks with equal
signatures run the same code on same-shaped data, so they allocate the same bytes and issue the
same sequence of (kind, shape, dtype) on corresponding groups. It is checked, not assumed: the dry
run also simulates the last member of every class with more than one, and ``compare_members``
fails the run, naming the two ranks and the first step where they differ, if the argument breaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..algo.graph import graph_for
from ..layout.mesh import Placement
from ..layout.realloc_plan import realloc_plan
from ..layout.shardmap import shard_map
from ..plan.execution_plan import ExecutionPlan
from ..plan.steps import Step, home_calls, report_rank, steps
from ..realloc.executor import DEFAULT_BUCKET_BYTES
from ..realloc.schedule import link_buckets, rank_rounds

VALUE_ROLES = ("critic", "reward")


def split_rows(n: int, parts: int) -> list[int]:
    """Rows of each part when ``n`` equal-length rows are split into ``parts`` (Batch.split's greedy
    packing by tokens then rows: round robin)."""
    return [math.ceil((n - j) / parts) for j in range(parts)]


@dataclass(frozen=True)
class Classes:
    """Ranks grouped by signature: ``members[i]`` the ranks of class i (sorted)."""

    members: tuple[tuple[int, ...], ...]

    def representatives(self) -> list[int]:
        return [m[0] for m in self.members]

    def checks(self) -> list[int]:
        """The last member of each class with more than one (simulated to check the argument)."""
        return [m[-1] for m in self.members if len(m) > 1]

    def simulated(self) -> list[int]:
        return sorted(set(self.representatives()) | set(self.checks()))

    def stand_in(self, rank: int) -> int:
        """The representative of ``rank``'s class."""
        return next(m[0] for m in self.members if rank in m)


def classes(cfg, plan: ExecutionPlan, models: dict, rows: dict[str, int]) -> Classes:
    """The plan's ranks grouped by signature. ``models``: role -> ModelConfig (None: no model);
    ``rows``: call -> sequences the call processes per iteration (per mini-batch for train calls)."""
    graph = graph_for(cfg.algo, cfg.data.samples_per_prompt)
    order = [s for s in steps(graph, plan, 0, 1, cfg.train.off_policy) if s.kind != "end"]
    home_of = home_calls(graph)
    homes = {role: plan.calls[c].placement for role, c in home_of.items()}
    by_sig: dict[tuple, list[int]] = {}
    for r in range(plan.cluster.size):
        kept = tuple(sorted(role for role, pl in homes.items() if r in pl.mesh.ranks and models.get(role)))
        sig = (kept,) + tuple(_step_sig(s, r, plan, models, rows, home_of) for s in order)
        by_sig.setdefault(sig, []).append(r)
    return Classes(tuple(tuple(m) for m in sorted(by_sig.values())))


def _step_sig(step: Step, r: int, plan: ExecutionPlan, models: dict, rows: dict[str, int],
              home_of: dict[str, str]) -> tuple | None:
    if r not in step.ranks:
        return None
    if step.kind == "call":
        pl = plan.calls[step.call].placement
        dp_i, tp_i, pp_i = pl.coords_of(r)
        n = split_rows(rows[step.call], pl.layout.dp)[dp_i]
        shards = _shards(models.get(step.role), pl, tp_i, pp_i, step.role in VALUE_ROLES)
        return ("call", pp_i, n, shards, r == pl.holders()[dp_i], r == report_rank(plan, step.call))
    if step.kind == "realloc":
        src = plan.calls[home_of[step.role]].placement
        dst = plan.calls[step.call].placement
        return ("realloc",) + _realloc_sig(models[step.role], src, dst, step.role in VALUE_ROLES, r)
    src = plan.calls[step.src_call].placement
    n = split_rows(rows[step.src_call], src.layout.dp)
    sent = tuple(n[d] for d, s in enumerate(step.senders) if s == r)
    return ("transfer", sent, r in step.receivers)


@lru_cache(maxsize=4096)
def _shards(mcfg, pl: Placement, tp_i: int, pp_i: int, value: bool) -> tuple:
    """Shapes of the parameter shards a rank at (tp_i, pp_i) of ``pl`` holds (None: no model)."""
    if mcfg is None:
        return ()
    sm = shard_map(mcfg, pl, value)
    r = pl.rank_of(0, tp_i, pp_i)
    return tuple((name, _box(sl)) for name, sl in sorted(sm.params_of(r).items()))


@lru_cache(maxsize=256)
def _plan_of(mcfg, src: Placement, dst: Placement, value: bool):
    return realloc_plan(shard_map(mcfg, src, value), shard_map(mcfg, dst, value))


def _box(region) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in region)


@lru_cache(maxsize=256)
def _links_of(mcfg, src: Placement, dst: Placement, value: bool) -> dict:
    return link_buckets(_plan_of(mcfg, src, dst, value), DEFAULT_BUCKET_BYTES)


def _realloc_sig(mcfg, src: Placement, dst: Placement, value: bool, r: int) -> tuple:
    """What decides the messages a reallocation issues on rank ``r``: the executor's rounds as it runs
    them (realloc/schedule.py ``rank_rounds``; per round the buckets to and from each peer in peer
    order, each piece's parameter, box shape and whether it travels as its own message), with the
    peers' identities left out; the shapes of the rank's source and destination shards (with a box's
    shape they decide whether a piece is sent from its place or through a buffer); its local copies.
    The multiset of pieces alone is not enough: two ranks can move the same pieces grouped into
    other buckets or rounds, and then issue other messages in another order."""
    plan = _plan_of(mcfg, src, dst, value)

    def bucket(b) -> tuple:
        return tuple((p.name, _box(p.region), d) for p, d in zip(b.pieces, b.direct, strict=True))

    rounds = tuple((tuple(map(bucket, sends)), tuple(map(bucket, recvs)))
                   for sends, recvs in rank_rounds(_links_of(mcfg, src, dst, value), r))
    held = tuple(tuple((n, _box(sl)) for n, sl in m.params_of(r).items()) if r in m.placement.mesh else ()
                 for m in (plan.src, plan.dst))
    copies = tuple(sorted((t.name, t.nbytes) for t in plan.copies if t.dst == r))
    return rounds, held, copies


def compare_members(a: int, b: int, steps_a: list, steps_b: list, ops_a: list, ops_b: list) -> str | None:
    """Why ranks ``a`` and ``b`` of one class did not do the same (None: they did): per step the
    peak bytes, and the sequence of (step, kind, shapes, dtypes, group size, plane) they issued."""
    for x, y in zip(steps_a, steps_b, strict=False):
        if (x.name, x.peak - x.start) != (y.name, y.peak - y.start):
            return (f"ranks {a} and {b} share a signature but differ in step '{x.name}': peak "
                    f"{x.peak - x.start} against {y.peak - y.start} bytes above the step's start")
    if len(steps_a) != len(steps_b):
        return f"ranks {a} and {b} share a signature but ran {len(steps_a)} and {len(steps_b)} steps"

    def shape(op):
        return (op.step, op.kind, op.shapes, op.dtypes, len(op.group), op.plane)

    for i, (x, y) in enumerate(zip(ops_a, ops_b, strict=False)):
        if shape(x) != shape(y):
            return (f"ranks {a} and {b} share a signature but their communication #{i} differs: "
                    f"{x.step}: {x.what()} on {len(x.group)} ranks against {y.step}: {y.what()} on {len(y.group)}")
    if len(ops_a) != len(ops_b):
        return f"ranks {a} and {b} share a signature but issued {len(ops_a)} and {len(ops_b)} communication calls"
    return None
