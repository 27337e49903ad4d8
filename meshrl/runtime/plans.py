"""``--plan STRATEGY|FILE.json`` -> a validated ExecutionPlan for the ranks of this run.

Strategies come from the planner (meshrl/plan/strategies.py). On CPU without a measured profile
the planner prices a stand-in preset and the run says so (meshrl/plan/fallback.py, shared with
`meshrl plan`); the plan still runs on the CPU ranks.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from ..algo.graph import graph_for, graph_of
from ..config import Config, role_spec
from ..errors import UserError
from ..plan.execution_plan import Cluster, ExecutionPlan
from ..plan.fallback import planning_problem
from ..plan.compile_choice import NO_PROFILE, choose_for_config
from ..plan.lag import choose_lag, with_lag
from ..plan.search import search
from ..plan.strategies import build
from ..model.presets import get_preset


def run_cluster(cfg: Config, world: int) -> Cluster:
    """The config's cluster if it has ``world`` devices, else one node of ``world`` local ranks."""
    c = cfg.cluster
    if c.nodes * c.devices_per_node == world:
        return Cluster(c.nodes, c.devices_per_node, c.device)
    return Cluster(1, world, c.device)


def _problem(cfg: Config, cluster: Cluster):
    """The planning problem for this run's ranks, with the planner's one fallback for a CPU without
    a profile (meshrl/plan/fallback.py, as `meshrl plan`)."""

    pcfg = copy.deepcopy(cfg)
    pcfg.cluster.nodes, pcfg.cluster.devices_per_node = cluster.nodes, cluster.devices_per_node
    return planning_problem(pcfg)


def resolve_plan(cfg: Config, spec: str, world: int) -> tuple[ExecutionPlan, str]:
    """(plan, a note for the log). ``spec``: a strategy name, 'search', or a plan JSON file."""
    return resolve_run(cfg, spec, world)[1:]


def resolve_run(cfg: Config, spec: str, world: int) -> tuple[Config, ExecutionPlan, str]:
    """(the run's config with ``train.off_policy=auto`` resolved, its plan, a note for the log).
    Under auto the lag is chosen with the plan (meshrl/plan/lag.py): a strategy or the search is
    found again for each lag; a plan file is priced at each lag as it is."""
    cluster = run_cluster(cfg, world)
    note = ""
    if spec == "disaggregated" and not any(c.kind == "generate" for c in graph_for(cfg.algo).calls):
        raise UserError(f"--plan disaggregated gives generation its own devices, but algo={cfg.algo} trains on "
                        "fixed data and generates nothing; use colocated, interleaved, heuristic or search")
    fixed = None
    if spec.endswith(".json") or Path(spec).is_file():
        fixed = ExecutionPlan.load(spec)
        if fixed.cluster.size != world:
            raise UserError(f"plan file {spec} is for {fixed.cluster.size} devices, but this run has {world} ranks")
        try:
            check_plan(cfg, fixed)
        except UserError as e:
            raise UserError(f"plan file {spec}: {e}") from None
    if fixed is not None and cfg.train.off_policy != "auto":
        return cfg, fixed, note
    problem, note = _problem(cfg, cluster)

    def plan_for(p) -> ExecutionPlan:
        if fixed is not None:
            return fixed
        return dataclasses.replace(search(p).plan if spec == "search" else build(p, spec), cluster=cluster)

    if cfg.train.off_policy == "auto":
        choice = choose_lag(problem, plan_for)
        cfg, plan = with_lag(cfg, choice.k), choice.plan
        note = "\n".join(x for x in (note, choice.line()) if x)
    else:
        plan = plan_for(problem)
    check_plan(cfg, plan)
    return cfg, plan, note


def resolve_compile(cfg: Config, plan: ExecutionPlan, world: int) -> tuple[Config, str]:
    """(the config with ``train.compile`` / ``gen.compile`` = auto resolved for ``plan``, the line
    the run's header prints: meshrl/plan/compile_choice.py); the lag must be resolved already."""
    if "auto" not in (cfg.train.compile, cfg.gen.compile):
        return cfg, ""
    problem, note = _problem(cfg, run_cluster(cfg, world))
    problem = dataclasses.replace(problem, off_policy=cfg.train.off_policy, off_policy_max=None)
    choice = choose_for_config(cfg, problem, plan, NO_PROFILE if note else "")
    return with_compile(cfg, choice.train, choice.gen), choice.line()


def with_compile(cfg: Config, train: bool, gen: bool) -> Config:
    """A copy of ``cfg`` whose train.compile / gen.compile left at auto become ``train`` / ``gen``
    (a value the user gave stays)."""
    pick = lambda now, chosen: chosen if now == "auto" else now  # noqa: E731
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile=pick(cfg.train.compile, train)),
                               gen=dataclasses.replace(cfg.gen, compile=pick(cfg.gen.compile, gen)))


def check_plan(cfg: Config, plan: ExecutionPlan) -> None:
    """UserError naming the culprit if the plan does not fit the run's graph, models or batch."""

    graph = graph_of(cfg)
    roles = {c.name: c.role for c in graph.calls}
    dims = {}
    for role in graph.roles():
        spec = role_spec(cfg.models, role)
        m = get_preset(spec.preset or "tiny") if not spec.path else None
        if m is not None:
            dims[role] = (m.num_attention_heads, m.num_hidden_layers)
    plan.validate(graph.names, dims if len(dims) == len(graph.roles()) else None, roles)
    offline = cfg.algo in ("sft", "rm", "dpo")  # one optimizer step on the whole batch of sequences or pairs
    rows = cfg.data.batch_size * (1 if offline else max(1, cfg.data.samples_per_prompt))
    per_mini = rows if offline else rows // max(1, cfg.ppo.mini_batches)
    for name, cp in plan.calls.items():
        limit = per_mini if graph.call(name).kind == "train" else rows
        if cp.layout.dp > limit:
            raise UserError(f"plan call {name}: dp={cp.layout.dp} is more than the {limit} sequences it gets "
                            "per step (data.batch_size x samples_per_prompt / ppo.mini_batches)")
    check_generation(cfg, plan, graph)
    check_memory(cfg, plan)


def check_generation(cfg: Config, plan: ExecutionPlan, graph) -> None:
    """UserError if gen.backend cannot run a generation call of the plan (meshrl/gen/checks.py)."""
    if cfg.gen.backend == "meshrl":
        return
    from ..gen import check_backend  # lazy: imports torch, which `meshrl plan` never loads
    from ..model.checkpoint import read_config  # lazy: imports torch, which `meshrl plan` never loads

    spec = cfg.models.actor
    model = read_config(spec.path)[0] if spec.path else get_preset(spec.preset or "tiny")
    device = "cuda" if cfg.cluster.device != "cpu" else "cpu"
    for c in graph.calls:
        if c.kind == "generate":
            lay = plan.calls[c.name].layout
            check_backend(cfg.gen.backend, c.name, lay.tp, lay.pp, device, model)


def check_memory(cfg: Config, plan: ExecutionPlan) -> None:
    """UserError, before any rank starts, if the planner finds a call over its devices' memory
    (Problem.call_memory: resident weights and optimizer state plus the call's own need), naming
    the call, the rank and the bytes."""
    cluster = Cluster(plan.cluster.nodes, plan.cluster.devices_per_node, cfg.cluster.device)
    problem, note = _problem(cfg, cluster)
    cap = problem.hw.mem_bytes
    for name, (need, rank) in problem.call_memory(plan).items():
        if need > cap:
            where = f" ({note})" if note else ""
            raise UserError(f"plan call {name} does not fit in memory: it needs {need / 2**30:.2f} GiB "
                            f"({int(need)} bytes) on rank {rank}, more than the {cap / 2**30:.0f} GiB "
                            f"of one {problem.hw.device} device{where}; use more devices, more tp/pp, or a "
                            "smaller model")


def plan_table(plan: ExecutionPlan, off_policy: int = 0) -> str:
    """The plan as a table: which ranks run each call, with which layout."""
    rows = [("call", "ranks", "layout", "micro-batches")]
    rows += [(n, str(cp.mesh), str(cp.layout), str(cp.micro_batches)) for n, cp in plan.calls.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n = plan.cluster.size
    head = f"plan: {plan.strategy} on {n} rank{'s' if n > 1 else ''} ({plan.cluster.device})" + \
        (f", generation {off_policy} step(s) off-policy (train.off_policy={off_policy})" if off_policy else "")
    return head + "\n" + "\n".join(lines)
