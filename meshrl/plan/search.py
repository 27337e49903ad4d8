"""Plan search: simulated annealing over per-call candidates, seeded with every strategy; and an
exhaustive branch-and-bound over the same candidates, the reference for small clusters.

A candidate is a CallPlan (aligned mesh, layout, micro-batches) whose own memory fits a device;
micro-batch counts that are both slower and hungrier than another on the same mesh and layout are
dropped (a list schedule never gets slower when a step gets shorter, so this loses nothing). The
objective is the simulated mean iteration time; plans over memory capacity are rejected.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace

from ..errors import UserError
from ..layout.mesh import Mesh
from .candidates import aligned_meshes, call_layouts, fit_micro_batches, micro_batch_options
from .execution_plan import CallPlan, ExecutionPlan
from .problem import Problem
from .simulator import iteration_time
from .strategies import BUILDERS
from .model_costs import model_costs
import itertools

INFEASIBLE = float("inf")


def candidates(problem: Problem, name: str) -> list[CallPlan]:
    """Every (aligned mesh, layout, micro-batch count) that fits a device, fastest first, less the
    dominated ones (a list schedule never gets slower when a step gets shorter, so dropping a
    candidate that is no faster and needs no less memory than another loses nothing):
    - per layout, micro-batch counts slower and hungrier than another count;
    - for a frozen role's only call, layouts with the same mesh and dp (so the same devices and
      data transfers) that are no faster and need no less memory, resident or transient.

    Aligned meshes of one size differ only in position (their groups cross nodes alike), so each
    size is estimated once and the result placed on every mesh of that size."""
    cap = problem.hw.mem_bytes
    role = problem.specs[name].role
    frozen_single = role not in problem.train_call and sum(
        1 for c in problem.graph.calls if c.role == role) == 1
    by_size: dict[int, list[Mesh]] = {}
    for mesh in aligned_meshes(problem.cluster.size, problem.cluster.devices_per_node):
        by_size.setdefault(mesh.size, []).append(mesh)
    out: list[tuple[float, CallPlan]] = []
    for meshes in by_size.values():
        kept: list[tuple[float, float, float, int, CallPlan]] = []  # time, weights, transient, dp, plan
        for lay in call_layouts(problem, name, meshes[0].size):
            for m in micro_batch_options(problem, name, lay):
                cp = CallPlan(meshes[0], lay, m)
                est = problem.call_estimate(name, cp)
                if est.mem_bytes <= cap:
                    kept.append((est.time_s, est.weights_bytes + est.state_bytes, est.transient_bytes,
                                 lay.dp if frozen_single else id(lay), cp))
        kept = [k for k in kept if not any(_dominates(o, k) for o in kept)]
        for t, _, _, _, cp in kept:
            out += [(t, CallPlan(mesh, cp.layout, cp.micro_batches)) for mesh in meshes]
    out.sort(key=lambda x: x[0])
    return [cp for _, cp in out]


def _dominates(a: tuple, b: tuple) -> bool:
    """a is as fast and as small as b (same dp group where it matters), and strictly better or
    earlier in a fixed order on ties (so of equal candidates exactly one survives)."""
    if a is b or a[3] != b[3] or a[0] > b[0] or a[1] > b[1] or a[2] > b[2]:
        return False
    return a[:3] != b[:3] or str(a[4].layout) + str(a[4].micro_batches) < str(b[4].layout) + str(b[4].micro_batches)


def score(problem: Problem, plan: ExecutionPlan, threshold: float = INFEASIBLE) -> float:
    """Simulated iteration time, or infinity for a plan over memory capacity. Reallocations not
    costed yet are costed (link_bytes is the slow part) only if the plan, with them taken as free,
    would beat ``threshold``; otherwise that optimistic time, already >= threshold, is returned."""
    if threshold < INFEASIBLE:
        load = [0.0] * problem.cluster.size  # each device runs its calls one after another
        for name, cp in plan.calls.items():
            t = problem.call_estimate(name, cp).time_s
            for r in cp.mesh.ranks:
                load[r] += t
        if max(load) >= threshold:
            return max(load)
    if not problem.feasible(plan):
        return INFEASIBLE
    problem.optimistic = True
    try:
        bound = iteration_time(problem, plan)
    finally:
        problem.optimistic = False
    if bound >= threshold:
        return bound
    return iteration_time(problem, plan)


@dataclass
class SearchResult:
    plan: ExecutionPlan
    iteration_s: float
    evaluations: int
    seconds: float


def _all_candidates(problem: Problem) -> dict[str, list[CallPlan]]:
    cands = {n: candidates(problem, n) for n in problem.graph.names}
    empty = [n for n, c in cands.items() if not c]
    if empty:
        spec = problem.specs[empty[0]]

        params = model_costs(spec.model, spec.value_head).total_params
        raise UserError(f"models.{spec.role} ({params / 1e9:.2f}B parameters) fits nowhere: its calls {empty} "
                        f"fit on no mesh of {problem.cluster.size} x {problem.hw.device} "
                        f"({problem.hw.mem_bytes / 2**30:.1f} GiB each); use more devices or a smaller model")
    return cands


def _on_mesh(cands: list[CallPlan], mesh) -> CallPlan | None:
    """The fastest candidate on ``mesh`` (candidates are sorted fastest first)."""
    return next((c for c in cands if c.mesh == mesh), None)


def _move(problem: Problem, plan: ExecutionPlan, cands: dict[str, list[CallPlan]], rng: random.Random
          ) -> ExecutionPlan:
    """One random change: a call to a random candidate, or to another layout on its mesh, or onto
    another call's mesh; a whole role onto one placement (no reallocation between its calls); or a
    call and its siblings (calls reading the same parents) onto one mesh, to run side by side."""
    graph = problem.graph
    name = rng.choice(graph.names)
    cur = plan.calls[name]
    kind = rng.random()
    calls = dict(plan.calls)
    if kind < 0.3:
        calls[name] = rng.choice(cands[name])
    elif kind < 0.5:
        calls[name] = rng.choice([c for c in cands[name] if c.mesh == cur.mesh] or cands[name])
    elif kind < 0.65:
        calls[name] = _on_mesh(cands[name], plan.calls[rng.choice(graph.names)].mesh) or cur
    elif kind < 0.8:
        role = problem.specs[name].role
        pick = rng.choice(cands[name])
        for n in graph.names:
            if problem.specs[n].role == role:
                match = [c for c in cands[n] if c.mesh == pick.mesh and c.layout == pick.layout]
                calls[n] = match[0] if match else calls[n]
    else:
        used = [cp.mesh for cp in plan.calls.values()]
        mesh = rng.choice(used) if rng.random() < 0.5 else rng.choice(cands[name]).mesh
        parents = set(graph.parents(name))
        for n in graph.names:
            if set(graph.parents(n)) == parents:
                calls[n] = _on_mesh(cands[n], mesh) or calls[n]
    return replace(plan, calls=calls)


class Budget:
    """The search's budget: ``steps`` plan evaluations (what makes a search reproducible: the same
    seed and steps give the same plan on any machine), and optionally wall-clock seconds as a cap
    (a search stopped by it depends on the machine's speed)."""

    def __init__(self, steps: int, time_limit_s: float | None = None) -> None:
        self.steps, self.used = steps, 0
        self.t0 = time.perf_counter()
        self.deadline = None if time_limit_s is None else self.t0 + time_limit_s

    def spend(self, n: int = 1) -> None:
        self.used += n

    def out(self) -> bool:
        return self.used >= self.steps or (self.deadline is not None and time.perf_counter() >= self.deadline)

    def fraction(self) -> float:
        return min(1.0, self.used / self.steps)


def _descend(problem: Problem, plan: ExecutionPlan, cost: float, cands: dict[str, list[CallPlan]],
             rng: random.Random, budget: Budget) -> tuple[ExecutionPlan, float]:
    """Coordinate descent: for each call in random order try every candidate, keep the best;
    repeat until a full sweep improves nothing (or the budget runs out)."""
    improved = True
    while improved and not budget.out():
        improved = False
        names = list(problem.graph.names)
        rng.shuffle(names)
        for name in names:
            for cp in cands[name]:
                if cp == plan.calls[name]:
                    continue
                cand = replace(plan, calls={**plan.calls, name: cp})
                c = score(problem, cand, cost)
                budget.spend()
                if c == INFEASIBLE and cost < INFEASIBLE:
                    # over memory beside the other calls as they are: refit their micro-batch counts
                    # to the memory now left (fewer in flight), the one move that pairs two calls
                    cand = _refit_others(problem, cand, name)
                    c = score(problem, cand, cost)
                    budget.spend()
                if c < cost * (1 - 1e-9):
                    plan, cost, improved = cand, c, True
                if budget.out():
                    return plan, cost
    return plan, cost


def _refit_others(problem: Problem, plan: ExecutionPlan, keep: str) -> ExecutionPlan:
    """``plan`` with every call but ``keep`` at the fastest micro-batch count that fits beside the
    rest (candidates.fit_micro_batches), ``keep`` as it is."""
    fitted = fit_micro_batches(problem, plan)
    return replace(fitted, calls={**fitted.calls, keep: plan.calls[keep]})


DEFAULT_STEPS = 20_000  # plan evaluations: the README's 70B example finds its plan (10.43 s) with 20k, not 10k


def search(problem: Problem, steps: int = DEFAULT_STEPS, seed: int = 0, time_limit_s: float | None = None,
           seeds: list[ExecutionPlan] | None = None) -> SearchResult:
    """Iterated local search: from every strategy's plan (and the all-fastest one), coordinate
    descent to a local optimum; then, until ``steps`` plan evaluations are spent (or the optional
    ``time_limit_s`` passes), perturb the best plans with one to three random moves and descend
    again, accepting a worse result with the simulated-annealing rule. Returns the best plan seen;
    for a fixed seed and steps, the same plan on any machine."""
    if steps < 1:
        raise UserError(f"search steps must be >= 1, got {steps}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise UserError(f"search time limit must be > 0 seconds, got {time_limit_s}")
    budget = Budget(steps, time_limit_s)
    rng = random.Random(seed)
    cands = _all_candidates(problem)
    if math.prod(len(c) for c in cands.values()) <= steps:  # a space this small: every plan, once
        return _enumerate(problem, cands, budget)
    if seeds is None:
        seeds = []
        for build in BUILDERS.values():
            try:
                seeds.append(build(problem))
            except UserError:
                continue
    fastest = ExecutionPlan(problem.cluster, {n: c[0] for n, c in cands.items()}, "search")
    starts = [replace(p, strategy="search") for p in seeds] + [fastest]
    chains: list[tuple[ExecutionPlan, float]] = []
    for p in starts:
        chains.append((p, score(problem, p)))
        budget.spend()
    best, best_cost = min(chains, key=lambda x: x[1])
    finite = [c for _, c in chains if c < INFEASIBLE]
    temp0 = 0.02 * (min(finite) if finite else 1.0)
    i = 0
    while not budget.out():
        plan, cost = chains[i % len(chains)]
        if i >= len(chains):  # after the first pass, perturb before descending
            for _ in range(rng.randint(1, 3)):
                plan = _move(problem, plan, cands, rng)
            cost = score(problem, plan)
            budget.spend()
        plan, cost = _descend(problem, plan, cost, cands, rng, budget)
        old = chains[i % len(chains)][1]
        temp = temp0 * (1e-3 ** budget.fraction())
        if cost <= old or (cost < INFEASIBLE and old < INFEASIBLE
                           and rng.random() < math.exp((old - cost) / max(temp, 1e-12))):
            chains[i % len(chains)] = (plan, cost)
        if cost < best_cost:
            best, best_cost = plan, cost
        i += 1
    return SearchResult(replace(best, strategy="search"), best_cost, budget.used, time.perf_counter() - budget.t0)


def _enumerate(problem: Problem, cands: dict[str, list[CallPlan]], budget: Budget) -> SearchResult:
    """The best of every combination of candidates (the space has at most budget.steps plans)."""

    names = list(cands)
    best, best_cost = None, INFEASIBLE
    for combo in itertools.product(*(cands[n] for n in names)):
        plan = ExecutionPlan(problem.cluster, dict(zip(names, combo, strict=True)), "search")
        cost = score(problem, plan, best_cost)
        budget.spend()
        if best is None or cost < best_cost:
            best, best_cost = plan, cost
    return SearchResult(best, best_cost, budget.used, time.perf_counter() - budget.t0)


def exhaustive(problem: Problem, time_limit_s: float = 600.0, upper: ExecutionPlan | None = None) -> SearchResult:
    """The optimum over the same candidates, by depth-first branch and bound: calls are placed
    longest first, each trying its candidates fastest first; a partial plan is cut when its memory
    already overflows or when a simulation in which the unplaced calls take their shortest time on
    no device (a lower bound, see simulator.build_events) is no better than the best plan so far.
    ``upper``: a feasible plan whose time starts the bound (exactness does not depend on it).
    (Devices are not interchangeable here: a layout orders its mesh's ranks, so swapping two
    blocks of devices changes which stage or shard lands where, and with it the realloc costs.)"""
    t0 = time.perf_counter()
    cands = _all_candidates(problem)
    order = sorted(problem.graph.names, key=lambda n: -problem.call_estimate(n, cands[n][0]).time_s)
    shortest = {n: problem.call_estimate(n, cands[n][0]).time_s for n in order}
    n_dev = problem.cluster.size
    # Device-seconds a call needs at least; their sum over all devices bounds the busiest one.
    min_area = {n: min(problem.call_estimate(n, c).time_s * c.mesh.size for c in cands[n]) for n in order}
    rest_area = [sum(min_area[n] for n in order[i:]) for i in range(len(order) + 1)]
    best: list = [None, INFEASIBLE]
    if upper is not None and problem.feasible(upper):
        best = [upper, iteration_time(problem, upper)]
    evals = [0]

    def visit(i: int, calls: dict[str, CallPlan], load: list[float]) -> None:
        if time.perf_counter() - t0 > time_limit_s:
            raise UserError(f"exhaustive search ran past {time_limit_s} s; use a smaller cluster")
        # Each device runs its calls one at a time in every iteration: the busiest bounds the mean.
        if max(load) >= best[1] or (sum(load) + rest_area[i]) / n_dev >= best[1]:
            return
        plan = ExecutionPlan(problem.cluster, calls, "exhaustive")
        if calls and max(problem.device_memory(plan)) > problem.hw.mem_bytes:
            return
        evals[0] += 1
        bound = iteration_time(problem, plan, free={n: shortest[n] for n in order[i:]})
        if bound >= best[1]:
            return
        if i == len(order):
            best[0], best[1] = plan, bound
            return
        for cp in cands[order[i]]:
            t = problem.call_estimate(order[i], cp).time_s
            child = list(load)
            for r in cp.mesh.ranks:
                child[r] += t
            visit(i + 1, {**calls, order[i]: cp}, child)

    visit(0, {}, [0.0] * problem.cluster.size)
    if best[0] is None:
        raise UserError("no plan fits in memory")
    calls = {n: best[0].calls[n] for n in problem.graph.names}
    return SearchResult(replace(best[0], calls=calls, strategy="exhaustive"), best[1], evals[0],
                        time.perf_counter() - t0)
