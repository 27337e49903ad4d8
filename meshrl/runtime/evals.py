"""Evaluations as steps of the walk, like calls, reallocations and transfers.

Two kinds of evaluation run while training, each on its role's home placement:

- ``eval held-out`` (eval.path, meshrl/algo/evaluate.py): the actor as it stands before iteration t,
  so before the first iteration and right after the end of iteration t-1; its figures join the
  record of iteration t;
- ``eval demo`` (meshrl/algo/demo_evals.py): the demo's evaluations due at iteration t, right before
  the end of iteration t; their figures join the record of iteration t.

``with_evals`` puts these steps into the global order (every rank sees them at the same place, so
their collectives line up); ``held_out`` and ``demo`` run one on this rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from ..algo.batch import Batch
from ..algo.calls import Place
from ..algo.common import CallContext
from ..algo.demo_evals import Evaluation
from ..algo.evaluate import eval_batch, eval_due, eval_metrics, eval_rows
from ..config import Config
from ..parallel import comm
from ..plan.steps import Step
from .roles import RoleModels


def with_evals(order: Iterable[Step], cfg: Config, evals: list[Evaluation], start: int, stop: int,
               world: int) -> Iterator[Step]:
    """``order`` (plan/steps.py) with the evaluation steps of iterations start..stop-1 put in."""
    everyone = tuple(range(world))
    if eval_due(cfg, start):
        yield Step("eval", start, "held-out", everyone)
    for step in order:
        t = step.iteration
        if step.kind == "end" and any(ev.due(t) for ev in evals):
            yield Step("eval", t, "demo", everyone)
        yield step
        if step.kind == "end" and t + 1 < stop and eval_due(cfg, t + 1):
            yield Step("eval", t + 1, "held-out", everyone)


def held_out(cfg: Config, roles: dict[str, RoleModels], tok, rank: int, t: int) -> dict[str, float]:
    """Evaluate the actor on the eval prompts (a collective over every rank): the ranks of the
    actor's home layout generate their replica's part, each replica's holder sends its rewards to
    rank 0, which returns the figures (other ranks: {})."""
    role = roles["actor"]
    if role.offloaded:
        role.reload()
    home = role.home
    mine = None
    if rank in home.mesh.ranks:
        dp_i, _, pp_i = home.coords_of(rank)
        batch = eval_batch(cfg, tok)
        part = batch.split(home.layout.dp)[dp_i] if home.layout.dp > 1 else batch.select(torch.arange(len(batch)))
        place = Place(dp_i, home.layout.dp, 1, holds_output=pp_i == home.layout.pp - 1)
        rows = eval_rows(role.handle(home), part, CallContext(cfg, t, tok, algo="eval"), place)
        mine = rows if rank == home.holders()[dp_i] else None
    out: list | None = [None] * dist.get_world_size() if rank == 0 else None
    comm.gather_object(mine, out, 0, comm.control(None))
    if out is None:
        return {}
    return eval_metrics(Batch.merge([b for b in out if b is not None]), cfg)


def demo(cfg: Config, evals: list[Evaluation], roles: dict[str, RoleModels], tok, rank: int, t: int
         ) -> dict[str, float]:
    """The demo evaluations due at iteration t that this rank takes part in -> this rank's parts of
    their means (rank 0 adds up every rank's parts)."""
    sums: dict[str, float] = {}
    for ev in evals:
        pl = roles[ev.role].home
        if not ev.due(t) or rank not in pl.mesh:
            continue
        dp_i = pl.coords_of(rank)[0]
        rows = ev.rows(t)
        part = rows.split(pl.layout.dp)[dp_i]
        place = Place(dp_i, pl.layout.dp, 1, holds_output=rank == pl.holders()[dp_i])
        got = ev.fn(roles[ev.role].handle(pl), part, CallContext(cfg, t, tok, ev.algo), place)
        if got is not None:
            sums[ev.metric] = sums.get(ev.metric, 0.0) + got / len(rows)
    return sums
