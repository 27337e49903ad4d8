"""Predicted against measured step times of a plan (pure Python: no torch).

``meshrl plan --validate`` runs the chosen plan on this machine's CPU ranks (meshrl/runtime/validate.py)
and hands the metrics records here. Measured times are the runtime's own ``time/`` figures: per
call, reallocation and transfer the slowest rank's seconds in that step, per iteration the wall time
between two ends of iteration. Iteration 0 is a warm-up (first calls allocate, caches are cold) and
is left out; each figure is the median over the remaining iterations.

Predicted times are the simulator's: per step its time as run in iterations 1 to ITERS - 1 (the
estimator's cost, stretched where ranks share cores: see simulator.py), per iteration the steady
state, the makespan of ITERS simulated iterations less that of one, over ITERS - 1 (an asynchronous
plan pays its pipeline fill once, as a long run does).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..config import Config
from .execution_plan import ExecutionPlan
from .problem import Problem
from .simulator import build_events, schedule, sharing

ITERS = 5
PREFIX = {"call": "time/call/", "realloc": "time/realloc/", "transfer": "time/transfer/"}


@dataclass(frozen=True)
class Row:
    """One step (``kind`` call | realloc | transfer | iteration): predicted and measured seconds."""

    name: str
    kind: str
    predicted: float
    measured: float
    modelled: bool = True  # False: a step that runs no model (a rule reward), left out of the error

    @property
    def error(self) -> float:
        """(predicted - measured) / measured; nan when nothing was measured."""
        if not self.measured or not math.isfinite(self.measured):
            return math.nan
        return (self.predicted - self.measured) / self.measured


def rule_calls(cfg: Config, plan: ExecutionPlan) -> tuple[str, ...]:
    """Calls that run no model here: the reward call when the reward is a rule (no models.reward.path)."""
    if cfg.models.reward.path is not None or cfg.algo == "rm":
        return ()
    return tuple(n for n in plan.calls if n.startswith("reward"))


def steady_iteration_s(problem: Problem, plan: ExecutionPlan, iterations: int = ITERS) -> float:
    """Seconds per iteration once the run is going (the first iteration's fill left out)."""
    one = schedule(build_events(problem, plan, 1), problem.cluster.size, sharing(problem))
    many = schedule(build_events(problem, plan, iterations), problem.cluster.size, sharing(problem))
    return (many - one) / (iterations - 1)


def predicted_steps(problem: Problem, plan: ExecutionPlan, iterations: int = ITERS) -> dict[str, tuple[str, float]]:
    """{step label: (kind, seconds per iteration)}: every call, realloc and transfer of the simulated
    iterations 1 to ``iterations`` - 1, each as run (labels as the runtime's: 'actor->actor_gen',
    'p->c'). Without shared cores a call's time is the estimator's, with them its stretched time."""
    share = sharing(problem)
    events = build_events(problem, plan, iterations)
    schedule(events, problem.cluster.size, share)
    out: dict[str, tuple[str, float]] = {}
    steady = range(1, iterations)
    for ev in events:
        if ev.iteration in steady and ev.kind != "end":
            label = ev.name if ev.kind == "call" else ev.name.split(" ", 1)[1]
            span = ev.duration if share is None else ev.end - ev.start
            out[label] = (ev.kind, out.get(label, (ev.kind, 0.0))[1] + span / len(steady))
    return out


def measured_steps(records: list[dict], skip: int = 1) -> dict[str, tuple[str, float]]:
    """{step label: (kind, median seconds)} from the runtime's metrics records, plus 'iteration'."""
    recs = records[skip:] if len(records) > skip else records
    out: dict[str, tuple[str, float]] = {}
    for kind, pre in PREFIX.items():
        keys = sorted({k for r in recs for k in r if k.startswith(pre)})
        for k in keys:
            out[k[len(pre):]] = (kind, statistics.median(r.get(k, 0.0) for r in recs))
    out["iteration"] = ("iteration", statistics.median(r["time/iteration"] for r in recs))
    return out


def compare(problem: Problem, plan: ExecutionPlan, records: list[dict], unmodelled: tuple[str, ...] = (),
            skip: int = 1) -> list[Row]:
    """One row per call (graph order), then every realloc and transfer either side has, then the
    iteration. ``unmodelled``: calls that run no model (rule rewards), kept out of the errors."""
    pred = predicted_steps(problem, plan)
    meas = measured_steps(records, skip)
    rows = [Row(n, "call", pred[n][1], meas.get(n, ("call", math.nan))[1], n not in unmodelled)
            for n in plan.calls]
    others = sorted({k for k, (kind, _) in {**pred, **meas}.items() if kind in ("realloc", "transfer")},
                    key=lambda k: (pred.get(k, meas.get(k))[0], k))
    for k in others:
        kind = pred.get(k, meas.get(k))[0]
        rows.append(Row(k, kind, pred.get(k, (kind, 0.0))[1], meas.get(k, (kind, 0.0))[1]))
    rows.append(Row("iteration", "iteration", steady_iteration_s(problem, plan), meas["iteration"][1]))
    return rows


def summary(rows: list[Row]) -> tuple[float, float, int]:
    """(median |error|, worst |error|, count) over the modelled calls and the iteration."""
    errs = [abs(r.error) for r in rows if r.kind in ("call", "iteration") and r.modelled and math.isfinite(r.error)]
    if not errs:
        return math.nan, math.nan, 0
    return statistics.median(errs), max(errs), len(errs)


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table."""
    lines = [("step", "kind", "predicted s", "measured s", "error")]
    for r in rows:
        err = "n/a (no model)" if not r.modelled else (
            "-" if r.kind not in ("call", "iteration") or not math.isfinite(r.error) else f"{r.error:+.0%}")
        lines.append((r.name, r.kind, f"{r.predicted:.4f}", f"{r.measured:.4f}", err))
    w = [max(len(line[i]) for line in lines) for i in range(5)]
    out = ["  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(line)) for line in lines]
    out.insert(1, "  ".join("-" * x for x in w))
    med, worst, n = summary(rows)
    out.append(f"median |error| {med:.0%}, worst {worst:.0%} over {n} calls and the iteration")
    if any(r.kind in ("realloc", "transfer") for r in rows):
        out.append("(realloc and transfer: the measured seconds include waiting for the other side to reach the "
                   "step, which the simulator counts as idle time; no error is quoted for them)")
    return "\n".join(out)


MEM_PREFIX = "perf/mem_gib/"


def memory(problem: Problem, plan: ExecutionPlan, records: list[dict]) -> dict[str, tuple[float, float]]:
    """{call: (predicted GiB, measured GiB)}: the planner's peak on the call's busiest rank
    (Problem.call_memory) against the runtime's measured peak (the busiest rank's, iteration 0)."""
    pred = problem.call_memory(plan)
    meas = next((r for r in records if any(k.startswith(MEM_PREFIX) for k in r)), {})
    return {n: (pred[n][0] / 2**30, meas.get(MEM_PREFIX + n, math.nan)) for n in plan.calls}


def memory_summary(mem: dict[str, tuple[float, float]], unmodelled: tuple[str, ...] = ()) -> tuple[float, float]:
    """(median |error|, worst |error|) of predicted against measured memory over the modelled calls."""
    errs = [abs(p - m) / m for n, (p, m) in mem.items() if n not in unmodelled and m and math.isfinite(m)]
    return (statistics.median(errs), max(errs)) if errs else (math.nan, math.nan)


def to_json(rows: list[Row], mem: dict[str, tuple[float, float]]) -> dict:
    """``--validate --json``: {"calls": {NAME: {predicted_s, measured_s, predicted_mem_gib,
    measured_mem_gib}}, "iteration": {predicted_s, measured_s}, plus the steps between calls}."""
    calls = {r.name: {"predicted_s": r.predicted, "measured_s": r.measured,
                      "predicted_mem_gib": mem[r.name][0], "measured_mem_gib": mem[r.name][1],
                      "modelled": r.modelled} for r in rows if r.kind == "call"}
    it = next(r for r in rows if r.kind == "iteration")
    steps = {r.name: {"kind": r.kind, "predicted_s": r.predicted, "measured_s": r.measured}
             for r in rows if r.kind in ("realloc", "transfer")}
    return {"calls": calls, "iteration": {"predicted_s": it.predicted, "measured_s": it.measured}, "steps": steps}
