"""Refit the per-call costs from a run's own measurements, and re-plan (pure Python: no torch).

``meshrl plan --calibrate OUT/`` reads what a finished or running job left in OUT/ (config.yaml,
plan.json and metrics.jsonl, whose ``time/call/NAME`` figures are the slowest rank's seconds per
call; trace.json holds the same steps per rank and is not needed), compares them with what the
planner predicted for that plan (plan/validate.py), and refits each call's cost as its measured
over predicted seconds: one factor per call, applied to every layout and mesh the search tries for
it (Problem.call_scale). The assumption is that the estimator's error for a call is a bias of that
call (its model, its kind, this machine), not of one layout; the search then re-plans with the
refitted costs, and the run's own plan is scored the same way, so the gain compares like with like.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UserError
from .execution_plan import ExecutionPlan
from .problem import Problem
from .validate import Row, compare, steady_iteration_s

MIN_SCALE, MAX_SCALE = 0.05, 20.0  # a factor outside this is a broken measurement, not a bias


@dataclass
class Refit:
    rows: list[Row]  # the run's plan: predicted (before the refit) against measured, per step
    scales: dict[str, float]  # call -> measured / predicted
    problem: Problem  # the problem with the refitted costs

    def run_plan_s(self, plan: ExecutionPlan) -> float:
        """Seconds per iteration of ``plan`` under the refitted costs."""
        return steady_iteration_s(self.problem, plan)


def read_run(out: str | Path) -> tuple[Path, ExecutionPlan, list[dict]]:
    """(config.yaml path, the plan the run used, its complete metrics records) of the run in ``out``."""
    out = Path(out)
    for name in ("config.yaml", "plan.json", "metrics.jsonl"):
        if not (out / name).is_file():
            hint = " (single-process runs write no plan: run with --nprocs N --plan ...)" if name == "plan.json" else ""
            raise UserError(f"--calibrate {out}: {out / name} does not exist{hint}")
    records = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a last line cut short by a kill
    if len(records) < 2:
        raise UserError(f"--calibrate {out}: metrics.jsonl has {len(records)} complete iteration(s); "
                        "at least 2 are needed (the first is a warm-up)")
    return out / "config.yaml", ExecutionPlan.load(out / "plan.json"), records


def refit(problem: Problem, plan: ExecutionPlan, records: list[dict], unmodelled: tuple[str, ...] = (),
          skip: int = 1) -> Refit:
    """The per-call factors measured / predicted for ``plan`` as run, and the refitted problem.
    Calls without a finite measurement keep factor 1; ``unmodelled`` calls (no model: a rule
    reward) are left out of the error table but priced at their measured time too."""
    rows = compare(problem, plan, records, unmodelled, skip)
    scales = {}
    for r in rows:
        if r.kind == "call" and r.predicted > 0 and math.isfinite(r.measured) and r.measured > 0:
            base = problem.call_scale.get(r.name, 1.0)
            # A call that runs no model (a rule reward) takes its measured time whatever it is.
            lo = MIN_SCALE if r.modelled else 0.0
            scales[r.name] = min(MAX_SCALE, max(lo, base * r.measured / r.predicted))
    return Refit(rows, scales, replace(problem, call_scale={**problem.call_scale, **scales}))


def scales_table(scales: dict[str, float]) -> str:
    if not scales:
        return "no call had a measurement to refit"
    w = max(len(n) for n in scales)
    return "\n".join(f"{n.ljust(w)}  x{k:.3f}" for n, k in scales.items())
