"""``train.off_policy=auto``: the planner chooses the lag k together with the placement.

Lag k (``train.off_policy=k``) lets the generation of iteration t+k run while iteration t trains,
from weights k updates old. A larger k can only hide more generation behind training, but every
version of staleness is paid in learning: the samples come from an older policy (the importance
weights of ``ppo.decoupled`` / ``ppo.rollout_is`` correct for it, with more variance the older they
are). The planner sees only the time, so it takes the smallest lag that buys real time: for each
k = 0 .. ``train.off_policy_max`` it finds the plan for that lag (the search, a strategy, or the
user's plan file) and prices it in the steady state (plan/simulator.py); going up from k = 0, a lag
replaces the one chosen so far only if it is at least ``MIN_GAIN`` faster than it.

Pure planning: no torch, no process groups. The runtime resolves the lag once, when a run starts,
and keeps it across re-plans and resumes (the lag changes the numbers; a plan never does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .execution_plan import ExecutionPlan
from .problem import Problem
from .simulator import iteration_time

# A lag must save this fraction of the iteration time over every smaller lag to be chosen: a
# policy choice (how much staleness a few percent of speed is worth), not a cost of the hardware.
MIN_GAIN = 0.05


@dataclass(frozen=True)
class LagChoice:
    k: int  # the chosen train.off_policy
    plan: ExecutionPlan  # the plan found for that lag
    seconds: dict[int, float]  # each lag -> the predicted steady-state seconds per iteration of its plan

    def gain(self, k: int | None = None) -> float:
        """How much faster lag ``k`` (default: the chosen one) is than lag 0."""
        return self.seconds[0] / self.seconds[self.k if k is None else k]

    def line(self) -> str:
        """One line for a console: each lag's predicted time and the choice."""
        parts = [f"k={k} {s:.3g} s" + (f" ({self.seconds[0] / s:.2f}x)" if k else "")
                 for k, s in self.seconds.items()]
        why = ("no lag saves time here" if self.k == 0 else
               f"{self.gain():.2f}x lag 0; each larger lag saves less than {MIN_GAIN:.0%} more")
        return (f"train.off_policy=auto (lags 0..{max(self.seconds)}, train.off_policy_max): "
                + " | ".join(parts) + f" -> k={self.k} ({why})")


def choose_lag(problem: Problem, plan_for: Callable[[Problem], ExecutionPlan]) -> LagChoice:
    """The lag and its plan for ``problem`` (whose ``off_policy_max`` bounds the lags tried).
    ``plan_for(problem at lag k)`` returns the plan to run at that lag (a search, a strategy's
    builder, or a fixed plan); each is priced at its own lag."""
    top = problem.off_policy_max
    if top is None:
        raise ValueError("choose_lag needs a problem with off_policy_max (train.off_policy=auto)")
    if not any(c.kind == "generate" for c in problem.graph.calls):
        top = 0  # sft / rm / dpo train on fixed data: there is no generation to run ahead
    plans: dict[int, ExecutionPlan] = {}
    seconds: dict[int, float] = {}
    for k in range(top + 1):
        at_k = dataclasses.replace(problem, off_policy=k, off_policy_max=None)
        plans[k] = plan_for(at_k)
        seconds[k] = iteration_time(at_k, plans[k])
    chosen = pick(seconds)
    return LagChoice(chosen, plans[chosen], seconds)


def pick(seconds: dict[int, float]) -> int:
    """The lag chosen from each lag's predicted seconds per iteration (lags 0, 1, ..): going up from
    0, a lag replaces the one chosen so far if it is at least MIN_GAIN faster than it."""
    chosen = 0
    for k in sorted(seconds)[1:]:
        if seconds[k] < seconds[chosen] * (1 - MIN_GAIN):
            chosen = k
    return chosen


def with_lag(cfg, k: int):
    """A copy of the run config ``cfg`` with ``train.off_policy=k`` (auto resolved); at k = 0 a
    ``train.stream_steps`` number has nothing to stream over and becomes 0 (whole batches)."""
    train = dataclasses.replace(cfg.train, off_policy=k)
    if k == 0 and isinstance(train.stream_steps, int):
        train = dataclasses.replace(train, stream_steps=0)
    return dataclasses.replace(cfg, train=train)
