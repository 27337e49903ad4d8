"""What every rank runs for ``meshrl train --nprocs N`` (or under torchrun), as one loop:

    engine = build(plan)
    for it in engine.iterate(start, stop):        # yields each iteration as it ends
        report(it)                                # rank 0: metrics.jsonl, console, trace.json
        checkpoint if due                         # meshrl/runtime/checkpoint.py
        decision = replan.after(...) if due       # the next plan, or stay
        if it switches: break                     # -> build the next plan's engine from the checkpoint

The reporting state lives in a ``Reporter`` (runtime/report.py); a re-plan returns its decision.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..algo.graph import graph_of
from ..config import Config
from ..gen import close_all
from ..parallel import comm
from ..parallel.groups import GroupCache, all_axes
from ..plan.execution_plan import ExecutionPlan
from ..plan.problem import role_model
from . import faults, replan
from .ahead import restore_ahead, save_after
from .checkpoint import export_trained, latest_checkpoint, load_checkpoint
from .engine import Engine
from .report import Reporter

_CACHE: GroupCache | None = None


def process_cache(timeout_s: float) -> GroupCache:
    """This process's one GroupCache. It outlives a run on purpose: on gloo, destroying a group and
    making the same ranks' group again later hangs (meshrl/parallel/groups.py), and a test's rank
    pool runs many plans in one process."""
    global _CACHE
    if _CACHE is None:
        _CACHE = GroupCache(timeout_s)
    return _CACHE


def end_world() -> None:
    """End this process's distributed world: its generation engines (they hold groups of their
    own), then every reference meshrl keeps to a group (the process cache, comm's control groups),
    then the process group, then a garbage collection, so each gloo group is freed and its threads
    joined now, while the interpreter runs. A group still referenced when the process exits is freed
    during teardown with its threads unjoined and the C++ runtime aborts the rank ("terminate called
    without an active exception"; pytorch/pytorch#65513) after the job itself has finished."""
    global _CACHE
    close_all()
    _CACHE = None
    comm.forget()
    if dist.is_initialized():  # (a vLLM engine's shutdown destroys the default group itself)
        dist.destroy_process_group()
    gc.collect()


def plan_groups(plan: ExecutionPlan, kv_heads: set[int]) -> list[tuple[int, ...]]:
    """Every process group (sorted ranks, size > 1) that any rank's ParallelModel of any call will
    ask the cache for: every axis of each placement (parallel/groups.all_axes), for each KV head count."""
    out: dict[tuple[int, ...], None] = {}
    for cp in plan.calls.values():
        for kv in sorted(kv_heads) or [None]:
            for groups in all_axes(cp.placement, kv).values():
                out.update((tuple(sorted(g)), None) for g in groups if len(set(g)) > 1)
    return list(out)


def check_group_names() -> None:
    """Fail (naming the ranks) unless every rank has made as many process groups as rank 0.

    ``dist.new_group`` names a group by a per-process counter of groups made so far, so ranks whose
    counts differ give the next group different names and its creation never completes: a silent
    hang, here turned into an error. The count is torch's (``_world.group_count``); where a torch
    lacks it, the check is skipped."""
    mine = getattr(getattr(c10d, "_world", None), "group_count", None)
    counts: list = [None] * dist.get_world_size()
    comm.all_gather_object(counts, mine, comm.control(None))
    if mine is not None and len(set(counts)) > 1:
        raise RuntimeError(f"the ranks have made different numbers of process groups (by rank: {counts}): "
                           "a group was made by only some ranks, so the next group would never form")


def make_groups(cache: GroupCache, groups: list[tuple[int, ...]]) -> None:
    """Create the plan's groups in ``cache`` with every rank taking part, one after another, before
    any model is built (``GroupCache.make``: None on the ranks outside a group, so ``for_placement``
    never makes one again on some ranks only; a second job in the same processes reuses them).
    Why up front: groups made concurrently by disjoint rank sets (use_local_synchronization) left
    the first collective on one of them hanging now and then on gloo."""
    check_group_names()
    for key in groups:
        cache.make(key)


def model_configs(cfg: Config) -> list:
    """The model configs of the run's roles (presets or checkpoints), for the groups' kv axis."""
    graph = graph_of(cfg)
    return [role_model(cfg, role) for role in graph.roles()]


def build(cfg: Config, plan: ExecutionPlan, out: str | None, start: int, timeout_s: float,
          log: Callable[[str], None], status: Path | None, hook: Callable[[str, int], None] | None = None
          ) -> tuple[Engine, int]:
    """This rank's engine for ``plan`` from iteration ``start`` (start > 0: the newest checkpoint in
    ``out`` read under this plan, whatever plan and world wrote it). Also returns for how many
    iterations from ``start`` on the generation ran before the checkpoint (async), so is not run again.
    ``hook``: the engine's step hook (runtime/faults.py)."""
    kv = {m.num_key_value_heads for m in model_configs(cfg)}
    make_groups(process_cache(timeout_s), plan_groups(plan, kv))
    engine = Engine(cfg, plan, process_cache(timeout_s), timeout_s, log, status, warm=start == 0, out=out,
                    hook=hook)
    if start == 0:
        return engine, False
    ck = latest_checkpoint(out)
    saved, early = load_checkpoint(ck, engine.roles, plan.to_json()) if ck is not None else (None, None)
    if saved != start - 1:
        raise RuntimeError(f"rank {dist.get_rank()}: no checkpoint of iteration {start - 1} in {out}")
    return engine, restore_ahead(engine, early, start) if early is not None else 0


def run_plans(cfg: Config, plan: ExecutionPlan, out: str | None, start: int, timeout_s: float, rep: Reporter,
              status: Path | None, fault, save_every: int):
    """rank_main's loop: build the plan's engine, run its iterations, checkpoint; at a re-plan, build
    the next plan's engine from the checkpoint just written and go on. Returns the last engine."""
    engine, ahead = build(cfg, plan, out, start, timeout_s, rep.log, status, fault)
    rep.log(f"{cfg.algo}: calls {' -> '.join(engine.graph.names)}")
    switch: replan.Decision | None = None
    while True:
        comm.barrier(comm.control(None))  # iteration timing starts when every rank has built its models
        rep.begin(plan, switch)
        switch = None
        for it in engine.iterate(start, cfg.train.iterations, ahead):
            rep.report(it)
            t = it.iteration
            due = out is not None and replan.due(cfg, t)  # a switch goes through the checkpoint
            if out is not None and (due or (t + 1) % save_every == 0 or t + 1 == cfg.train.iterations):
                save_after(engine, out, t, timeout_s, fault)  # after the metrics it covers
            decision = replan.after(cfg, plan, t, rep.plan_records()) if due else None
            rep.decided(decision)
            if decision is not None and decision.plan_json is not None:
                switch = decision
                break
        if switch is None:
            return engine
        # every rank, at the same boundary: drop this plan's models, build the next plan's and read
        # the checkpoint just written under it (the resharding resume, in these processes)
        engine = None
        plan, start = switch.next_plan(), switch.start
        engine, ahead = build(cfg, plan, out, start, timeout_s, rep.log, status, fault)


def rank_main(cfg: Config, plan: ExecutionPlan, out: str | None, start: int = 0, timeout_s: float = 300.0,
              status_dir: str | None = None, quiet: bool = False, save_every: int = 1, progress: bool = False
              ) -> list[dict] | None:
    """Run iterations ``start`` .. cfg.train.iterations-1 on this rank (start > 0: resume from the
    newest checkpoint in ``out``). Returns the metrics records on rank 0 (None elsewhere).
    ``quiet``: no console lines; ``progress``: a progress bar on rank 0. With ``out``, rank 0 also
    writes metrics.jsonl and trace.json, all ranks write a checkpoint every ``save_every``
    iterations, at the end and before a re-plan, and the trained model is exported to ``out/actor``
    (``out/reward`` for rm)."""
    rank = dist.get_rank()
    status = Path(status_dir) / f"rank{rank}" if status_dir else None
    fault = faults.from_env(rank, status)  # None unless a test asks for one (MESHRL_FAULT)
    rep = Reporter.open(cfg, plan, out, start, dist.get_world_size(), rank, rank == 0 and not quiet, progress)
    try:  # a failed step too ends the progress bar (the error then starts a line) and flushes the metrics
        engine = run_plans(cfg, plan, out, start, timeout_s, rep, status, fault, save_every)
    finally:
        rep.close()
    if out is not None:
        export_trained(engine.roles, cfg.algo, out, engine.tok)
    return rep.records if rank == 0 else None
