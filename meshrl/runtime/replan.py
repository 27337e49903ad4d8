"""Re-planning during a run (``meshrl train --replan-every N``): at iteration boundaries, refit
each call's cost from the run's own measurements (meshrl/plan/calibrate.py, what ``meshrl plan
--calibrate OUT/`` does), search a plan under the refitted costs, and switch to it when the
refitted estimate of the current plan is more than ``replan.min_gain`` slower.

Rank 0 decides (from the metrics records it holds) and broadcasts the decision on the control
plane, so every rank switches at the same boundary to the same plan. ``after`` returns the decision on
every rank, and the run's loop (meshrl/runtime/run.py) rebuilds under the next plan. A switch is the resharding
resume (meshrl/runtime/checkpoint.py) done in the running processes: the checkpoint of the
boundary's iteration is already on disk; every rank drops its models, builds the new plan's, and
reads the checkpoint under the new layout. The numbers go on as an unswitched run's, up to
reduction order (plans change speed, never results), also with a batch generated ahead.

The gain and the decision depend on measured times, so they are reported under ``perf/`` and
``time/`` (metrics.jsonl), on the console, and as a ``replan`` event in trace.json.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch.distributed as dist

from ..config import Config
from ..errors import UserError
from ..parallel import comm
from ..plan.execution_plan import ExecutionPlan
from ..plan.calibrate import refit
from ..plan.search import search
from .plans import _problem, check_plan
from ..plan.validate import rule_calls


@dataclass
class Decision:
    """What rank 0 found at a boundary; ``plan_json`` is the plan to switch to (None: stay)."""

    after: int  # the iteration the decision follows
    current_s: float  # the current plan's seconds per iteration under the refitted costs
    best_s: float  # the searched plan's
    plan_json: str | None
    note: str = ""  # why there was nothing to decide (too few measurements)
    t0: float = 0.0  # wall clock when the decision began (the re-plan's duration starts there)

    @property
    def gain(self) -> float:
        return self.current_s / self.best_s if self.best_s > 0 else 1.0

    @property
    def start(self) -> int:
        """The first iteration under the next plan."""
        return self.after + 1

    def next_plan(self) -> ExecutionPlan | None:
        """The plan to switch to (None: stay)."""
        return ExecutionPlan.from_json(self.plan_json) if self.plan_json is not None else None


def after(cfg: Config, plan: ExecutionPlan, t: int, records: list[dict]) -> Decision:
    """Every rank, after iteration t: rank 0 decides from ``records`` (this plan's iterations) and
    broadcasts the decision on the control plane, so every rank returns the same one."""
    t0 = time.time()
    d = dataclasses.replace(decide(cfg, plan, records, t), t0=t0) if dist.get_rank() == 0 else None
    return comm.broadcast_object(d, 0, comm.control(None))


def due(cfg: Config, t: int) -> bool:
    """Whether a re-plan follows iteration t (not after the last: nothing would run under it)."""
    every = cfg.replan.every
    return every > 0 and (t + 1) % every == 0 and t + 1 < cfg.train.iterations


def decide(cfg: Config, plan: ExecutionPlan, records: list[dict], after: int) -> Decision:
    """Refit from ``records`` (this plan's iterations; the first is skipped as a warm-up), search
    under the refitted costs and compare. Rank 0 only; pure planning (no process group)."""

    if len(records) < 2:
        return Decision(after, 0.0, 0.0, None, f"{len(records)} iteration(s) under this plan; 2 are needed")
    problem, _ = _problem(cfg, plan.cluster)  # (a copy of cfg with this cluster; CPU fallback as --plan)
    fit = refit(problem, plan, records, rule_calls(cfg, plan))
    # capped in time too: the other ranks wait for the decision within train.timeout
    found = search(fit.problem, steps=cfg.replan.search_steps, seed=cfg.train.seed, time_limit_s=cfg.train.timeout / 4)
    current, best = fit.run_plan_s(plan), found.iteration_s
    new = dataclasses.replace(found.plan, cluster=plan.cluster, strategy="replanned")
    if not current > best * (1.0 + cfg.replan.min_gain) or new.to_dict()["calls"] == plan.to_dict()["calls"]:
        return Decision(after, current, best, None)
    try:
        check_plan(cfg, new)
    except UserError as e:  # the search's plan does not fit this run (memory, batch sizes): stay
        return Decision(after, current, best, None, f"the searched plan does not fit: {e}")
    return Decision(after, current, best, new.to_json())


def line(d: Decision, min_gain: float) -> str:
    """The console line of a decision."""
    if d.note:
        return f"re-plan after iteration {d.after}: skipped ({d.note})"
    head = (f"re-plan after iteration {d.after}: refitted estimate {d.current_s:.4f} s per iteration for the "
            f"current plan, {d.best_s:.4f} s for the searched one (gain {d.gain:.2f}x")
    if d.plan_json is None:
        return head + f", not above 1 + replan.min_gain = {1 + min_gain:.2f}): staying"
    return head + f" > {1 + min_gain:.2f}): switching plans at iteration {d.after + 1}"


def metrics(d: Decision, seconds: float) -> dict[str, float]:
    """The decision's figures for the next iteration's record (timing-dependent: perf/, time/)."""
    if d.note:
        return {}
    return {"perf/replan/gain": d.gain, "perf/replan/switched": float(d.plan_json is not None),
            "perf/replan/current_s": d.current_s, "perf/replan/best_s": d.best_s, "time/replan": seconds}
