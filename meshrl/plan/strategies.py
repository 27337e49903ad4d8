"""The placement strategies as plan builders: each is one point of the plan space.

- ``colocated`` (DeepSpeed-Chat; Xiao et al.): every call on every device with one layout, as if
  the four models were one; the layout is the fastest that fits.
- ``interleaved`` (Xiao et al.): the actor's and reference's calls on one half of the cluster, the
  critic's and reward's on the other, so that independent calls run at the same time.
- ``disaggregated`` (Xiao et al.): generation on its own devices with a shadow actor that is
  refreshed (reallocated) after each update; everything else co-located on the rest. With
  ``train.off_policy=1`` generation of iteration t+1 overlaps training of iteration t.
- ``heuristic`` (Megatron-style, the baseline ReaL compares against): TP within a node (up to 8),
  PP across nodes (the fewest stages that fit), DP over the rest; one layout for every call.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import UserError
from ..layout.mesh import Layout, Mesh
from .candidates import call_layouts, fit_micro_batches, layouts, split_sizes
from .execution_plan import CallPlan, ExecutionPlan
from .problem import Problem
from .simulator import iteration_time

STRATEGIES = ("colocated", "interleaved", "disaggregated", "heuristic")


def _plan(problem: Problem, placements: dict[str, tuple[Mesh, Layout]], strategy: str) -> ExecutionPlan:
    plan = ExecutionPlan(problem.cluster, {n: CallPlan(m, lay) for n, (m, lay) in placements.items()},
                         strategy)
    return fit_micro_batches(problem, plan)


def _score(problem: Problem, plan: ExecutionPlan) -> tuple[bool, float]:
    """Sort key: feasible plans first, then by simulated iteration time (or by memory if none fit)."""
    if problem.feasible(plan):
        return (False, iteration_time(problem, plan))
    return (True, max(problem.device_memory(plan)))


def _shared_layouts(problem: Problem, names: list[str], size: int) -> list[Layout]:
    """Layouts of ``size`` devices that every call in ``names`` can take."""
    return [lay for lay in layouts(size, problem.cluster.devices_per_node)
            if all(problem.fits_layout(n, lay) for n in names)]


def _best_uniform(problem: Problem, names: list[str], mesh: Mesh, others: dict, strategy: str) -> ExecutionPlan:
    """The fastest plan giving every call in ``names`` the same layout on ``mesh`` (``others`` fixed)."""
    best, best_key = None, None
    for lay in _shared_layouts(problem, names, mesh.size):
        plan = _plan(problem, {**others, **{n: (mesh, lay) for n in names}}, strategy)
        key = _score(problem, plan)
        if best_key is None or key < best_key:
            best, best_key = plan, key
    if best is None:
        raise UserError(f"no layout of {mesh.size} devices suits every model of calls {names}")
    return best


def colocated(problem: Problem) -> ExecutionPlan:
    return _best_uniform(problem, problem.graph.names, Mesh.range(0, problem.cluster.size), {}, "colocated")


def _group_plan(problem: Problem, groups: list[list[str]], meshes: list[Mesh], strategy: str) -> ExecutionPlan:
    """Each group of calls on its own mesh with its own shared layout, chosen group by group (the
    groups share no device, so their layouts do not interact) and then scored together."""
    chosen: dict[str, tuple[Mesh, Layout]] = {}
    for names, mesh in zip(groups, meshes, strict=True):
        best, best_key = None, None
        for lay in _shared_layouts(problem, names, mesh.size):
            sub = {n: (mesh, lay) for n in names}
            total = sum(problem.call_estimate(n, CallPlan(mesh, lay)).time_s for n in names)
            # what the group's devices hold together (every role homed there, plus the largest
            # transient), not one call's need: two trained roles on one mesh add their states
            part = ExecutionPlan(problem.cluster, {n: CallPlan(m, lay) for n, (m, lay) in sub.items()}, strategy)
            mem = max(problem.device_memory(part))  # one micro-batch: the most memory
            key = (mem > problem.hw.mem_bytes, total)
            if best_key is None or key < best_key:
                best, best_key = sub, key
        if best is None:
            raise UserError(f"no layout of {mesh.size} devices suits every model of calls {names}")
        chosen.update(best)
    return _plan(problem, chosen, strategy)


def interleaved(problem: Problem) -> ExecutionPlan:
    n = problem.cluster.size
    if n < 2:
        return _plan(problem, {c: (Mesh.range(0, 1), Layout()) for c in problem.graph.names}, "interleaved")
    roles = problem.graph.roles()
    first = [r for r in roles if r in ("actor", "ref")] if "critic" in roles else ["actor"]
    a = [c.name for c in problem.graph.calls if c.role in first]
    b = [c.name for c in problem.graph.calls if c.role not in first]
    if not a or not b:  # one group only (e.g. sft, rm): nothing to interleave
        return replace(colocated(problem), strategy="interleaved")
    half = n // 2
    options = [[Mesh.range(0, half), Mesh.range(half, half)]]
    if n >= 4:
        q = n // 4  # uneven splits as aligned blocks: n/2 for one group, n/4 for the other
        options.append([Mesh.range(0, half), Mesh.range(half, q)])
        options.append([Mesh.range(0, q), Mesh.range(half, half)])
    plans = [_group_plan(problem, [a, b], meshes, "interleaved") for meshes in options]
    return min(plans, key=lambda p: _score(problem, p))


def disaggregated(problem: Problem) -> ExecutionPlan:
    n = problem.cluster.size
    gen = [c.name for c in problem.graph.calls if c.kind == "generate"]
    rest = [c.name for c in problem.graph.calls if c.kind != "generate"]
    if n < 2 or not gen:
        return replace(colocated(problem), strategy="disaggregated")
    plans = []
    for g in split_sizes(n):
        gen_mesh, train_mesh = Mesh.range(n - g, g), Mesh.range(0, n - g)
        try:
            plans.append(_group_plan(problem, [gen, rest], [gen_mesh, train_mesh], "disaggregated"))
        except UserError:
            continue
    if not plans:
        raise UserError("no disaggregated plan: no layout suits the generation call on any part of the cluster")
    return min(plans, key=lambda p: _score(problem, p))


def heuristic(problem: Problem) -> ExecutionPlan:
    """TP = devices per node (at most 8, lowered until every model takes it), PP = the fewest
    powers of two (across nodes) that fit in memory, DP = the rest."""
    n, dpn = problem.cluster.size, problem.cluster.devices_per_node
    names = problem.graph.names
    tp = min(dpn, 8)
    while tp > 1 and not all(problem.fits_layout(c, Layout(1, tp, 1)) for c in names):
        tp //= 2
    mesh = Mesh.range(0, n)
    plan = None
    pp = 1
    while pp * tp <= n:
        if n % (pp * tp) == 0:
            lay = Layout(n // (pp * tp), tp, pp)
            if all(problem.fits_layout(c, lay) for c in names):
                plan = _plan(problem, {c: (mesh, lay) for c in names}, "heuristic")
                if problem.feasible(plan):
                    return plan
        pp *= 2
    if plan is None:
        raise UserError(f"no Megatron-style layout of {n} devices suits every model")
    return plan


BUILDERS = {"colocated": colocated, "interleaved": interleaved, "disaggregated": disaggregated,
            "heuristic": heuristic}


def build(problem: Problem, name: str) -> ExecutionPlan:
    if name not in BUILDERS:
        raise UserError(f"unknown strategy {name!r}; known: {', '.join(BUILDERS)}, search")
    return BUILDERS[name](problem)


__all__ = ["STRATEGIES", "BUILDERS", "build", "colocated", "interleaved", "disaggregated", "heuristic",
           "call_layouts"]
