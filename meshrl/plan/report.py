"""Compare the strategies and the search for one problem, and say it in tables and words."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import UserError
from .execution_plan import ExecutionPlan
from .problem import Problem
from .search import DEFAULT_STEPS, search
from .simulator import Timeline, simulate
from .strategies import BUILDERS

GIB = 2**30
NAMES = (*BUILDERS, "search")


@dataclass
class Result:
    name: str
    plan: ExecutionPlan
    timeline: Timeline
    iteration_s: float
    pflops: float
    peak_mem_gib: float
    feasible: bool

    def to_dict(self) -> dict:
        return {"iteration_s": self.iteration_s, "pflops": self.pflops, "peak_mem_gib": self.peak_mem_gib,
                "feasible": self.feasible, "plan": self.plan.to_dict()}


def evaluate(problem: Problem, name: str, plan: ExecutionPlan) -> Result:
    tl = simulate(problem, plan)
    flops = problem.iteration_flops(plan)
    return Result(name, plan, tl, tl.iteration_s, flops / tl.iteration_s / 1e15,
                  max(problem.device_memory(plan)) / GIB, problem.feasible(plan))


def compare(problem: Problem, names: list[str], steps: int = DEFAULT_STEPS, seed: int = 0,
            time_limit_s: float | None = None) -> tuple[dict[str, Result], float]:
    """Results for each named strategy (and 'search': ``steps`` plan evaluations from ``seed``, optionally
    capped at ``time_limit_s`` seconds); the search's seconds (0 if not run).
    Raises UserError when no plan fits in memory at all, naming what does not fit."""
    out: dict[str, Result] = {}
    for name in names:
        if name != "search":
            out[name] = evaluate(problem, name, BUILDERS[name](problem))
    search_s = 0.0
    if "search" in names:
        t0 = time.perf_counter()
        seeds = [r.plan for r in out.values()] if len(out) == len(BUILDERS) else None
        res = search(problem, steps, seed, time_limit_s, seeds=seeds)
        search_s = time.perf_counter() - t0
        out["search"] = evaluate(problem, "search", res.plan)
    if not any(r.feasible for r in out.values()):
        best = min(out.values(), key=lambda r: r.peak_mem_gib)
        raise UserError(f"no plan fits in memory: the leanest ({best.name}) needs {best.peak_mem_gib:.1f} GiB "
                        f"on a device of {problem.hw.mem_bytes / GIB:.1f} GiB; use more devices or smaller models")
    return out, search_s


def plan_table(problem: Problem, plan: ExecutionPlan) -> str:
    """One row per call: mesh, layout, micro-batches, predicted time and memory, main cost."""
    rows = [("call", "mesh", "layout", "mb", "time_s", "mem_GiB", "dominant cost")]
    mem = problem.device_memory(plan)
    for name in problem.graph.names:
        cp = plan.calls[name]
        est = problem.call_estimate(name, cp)
        top = max(est.breakdown.items(), key=lambda kv: kv[1])[0] if est.breakdown else "-"
        rows.append((name, str(cp.mesh), str(cp.layout), str(cp.micro_batches), f"{est.time_s:.3f}",
                     f"{max(mem[r] for r in cp.mesh.ranks) / GIB:.1f}", top))
    return _table(rows)


def comparison_table(results: dict[str, Result]) -> str:
    rows = [("strategy", "iteration_s", "PFLOP/s", "peak_mem_GiB", "feasible")]
    for r in results.values():
        rows.append((r.name, f"{r.iteration_s:.3f}", f"{r.pflops:.3f}", f"{r.peak_mem_gib:.1f}",
                     "yes" if r.feasible else "NO"))
    return _table(rows)


def explain(problem: Problem, results: dict[str, Result], chosen: str) -> str:
    """Why the chosen plan wins: the call that takes most device time and what dominates it, where
    the device time goes, and the margin over the best strategy."""
    r = results[chosen]
    busy = r.timeline.busy
    total = r.iteration_s * problem.cluster.size
    top = max((n for n in busy if n in r.plan.calls), key=lambda n: busy[n])
    est = problem.call_estimate(top, r.plan.calls[top])
    parts = sorted(est.breakdown.items(), key=lambda kv: -kv[1])[:3]
    moves = sum(v for n, v in busy.items() if n not in r.plan.calls)
    idle = max(0.0, total - sum(busy.values()))
    lines = [f"{chosen}: the bottleneck is {top} ({busy[top] / total:.0%} of device time; "
             + ", ".join(f"{k} {v:.3g}s" for k, v in parts) + ")",
             f"device time: calls {1 - (moves + idle) / total:.0%}, reallocation/transfer {moves / total:.0%}, "
             f"idle {idle / total:.0%}"]
    others = [x for x in results.values() if x.name != chosen and x.feasible]
    if others:
        best = min(others, key=lambda x: x.iteration_s)
        lines.append(f"{r.iteration_s:.3f} s per iteration vs {best.iteration_s:.3f} s for {best.name} "
                     f"({best.iteration_s / r.iteration_s:.2f}x)")
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def compile_line(problem: Problem) -> str | None:
    """What train.compile / gen.compile do to the price (None when neither is set): the measured
    compiled / eager factors, or why the calls are priced as eager; the one-off compile is reported
    beside the iteration time, never in it."""
    s, c = problem.shape, problem.hw.compiled
    keys = ", ".join(k for k, on in (("train.compile", s.compile_layers), ("gen.compile", s.compile_gen)) if on)
    if not keys:
        return None
    if (c.fwd, c.fwd_bwd, c.decode) == (1.0, 1.0, 1.0):
        why = problem.hw.sources.get("compile", "the CPU profile has no compile measurement; `meshrl profile` "
                                     "(without --quick) measures it")
        return f"{keys}: priced as eager ({why})"
    once = sum(v for _, v in c.compile_s)
    return (f"{keys}: layers priced at the measured compiled / eager time (forward x{c.fwd:.2f}, forward + "
            f"backward x{c.fwd_bwd:.2f}, decoding step x{c.decode:.2f}; where tp = 1, dense layers); the one-off "
            f"compile (~{once:.0f} s when profiled) is not in the iteration time")
