"""The plan space: aligned meshes, layouts a model can take, micro-batch counts; and fitting a plan's
micro-batches into memory. Shared by the strategies, the search and the exhaustive reference."""

from __future__ import annotations

from dataclasses import replace

from ..layout.mesh import Layout, Mesh
from .execution_plan import CallPlan, ExecutionPlan
from .problem import Problem, rank_resident, rank_transients, rank_weights
from .estimator import max_micro_batches


def aligned_meshes(n_devices: int, devices_per_node: int) -> list[Mesh]:
    """Blocks of 1, 2, 4, ... devices at aligned offsets inside a node, and groups of 1, 2, 4, ...
    whole nodes at aligned node offsets (plus the whole cluster when its node count is not a
    power of two). As ReaL: these are the meshes a call may run on."""
    out: list[Mesh] = []
    size = 1
    while size < devices_per_node:
        for node_start in range(0, n_devices, devices_per_node):  # never across a node boundary
            out += [Mesh.range(node_start + s, size) for s in range(0, devices_per_node - size + 1, size)]
        size *= 2
    nodes = n_devices // devices_per_node
    k = 1
    while k <= nodes:
        out += [Mesh.range(s * devices_per_node, k * devices_per_node) for s in range(0, nodes - k + 1, k)]
        k *= 2
    whole = Mesh.range(0, n_devices)
    if whole not in out:
        out.append(whole)
    return out


def layouts(size: int, max_tp: int) -> list[Layout]:
    """Every dp x tp x pp = size with tp <= max_tp."""
    out = []
    for tp in range(1, min(size, max_tp) + 1):
        if size % tp:
            continue
        rest = size // tp
        for pp in range(1, rest + 1):
            if rest % pp == 0:
                out.append(Layout(rest // pp, tp, pp))
    return out


def call_layouts(problem: Problem, name: str, size: int) -> list[Layout]:
    return [lay for lay in layouts(size, problem.cluster.devices_per_node) if problem.fits_layout(name, lay)]


def micro_batch_options(problem: Problem, name: str, layout: Layout, limit: int = 64) -> list[int]:
    """1, 2, 4, ... up to the sequences per DP rank (and at most ``limit``)."""

    top = min(max_micro_batches(problem.specs[name], problem.shape, layout), limit)
    out, m = [], 1
    while m < top:
        out.append(m)
        m *= 2
    out.append(top)
    return out


def fit_micro_batches(problem: Problem, plan: ExecutionPlan) -> ExecutionPlan:
    """Give every call the fastest micro-batch count that fits next to what stays resident on its
    devices; where none fits, the one needing least memory (the plan then reports infeasible)."""
    base = replace(plan, calls={n: replace(cp, micro_batches=1) for n, cp in plan.calls.items()})
    resident = _resident(problem, base)
    cap = problem.hw.mem_bytes
    calls: dict[str, CallPlan] = {}
    for name, cp in plan.calls.items():
        temp = _temp_weights(problem, base, name)
        best, best_key = None, None
        for m in micro_batch_options(problem, name, cp.layout):
            cand = replace(cp, micro_batches=m)
            est = problem.call_estimate(name, cand)
            owns = rank_transients(cand, est)
            need = max(resident[r] + own + t for r, own, t in zip(cp.mesh.ranks, owns, temp, strict=True))
            key = (need > cap, est.time_s if need <= cap else need)
            if best_key is None or key < best_key:
                best, best_key = cand, key
        calls[name] = best
    return replace(plan, calls=calls)


def _resident(problem: Problem, plan: ExecutionPlan) -> list[float]:
    out = [0.0] * problem.cluster.size
    for role in problem.graph.roles():
        h = problem.home(plan, role)
        home = plan.calls[h]
        for r, own in zip(home.mesh.ranks, rank_resident(home, problem.call_estimate(h, home)), strict=True):
            out[r] += own
    return out


def _temp_weights(problem: Problem, plan: ExecutionPlan, name: str) -> list[float]:
    """Per rank of the call's mesh, its weights' temporary copy (its stage's; 0 in its home's placement)."""
    role = problem.specs[name].role
    h = problem.home(plan, role)
    cp = plan.calls[name]
    if h == name or plan.calls[h].placement == cp.placement:
        return [0.0] * cp.mesh.size
    return rank_weights(cp, problem.call_estimate(name, cp))


def split_sizes(n: int) -> list[int]:
    """Aligned sizes for a part of the cluster: n/2, n/4, ... down to 1."""
    out, s = [], n // 2
    while s >= 1:
        out.append(s)
        s //= 2
    return out
