"""What every rank runs for ``meshrl train --nprocs N`` (or under torchrun): build the engine, walk
the iterations, and on rank 0 turn the ranks' logs into one metrics record per iteration, a
console line, trace.json, and checkpoints (meshrl/runtime/checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from ..algo.graph import graph_of
from ..config import Config
from ..observe.trace import Trace
from ..parallel import comm
from ..parallel.groups import GroupCache, all_axes
from ..plan.execution_plan import ExecutionPlan
from .ahead import ahead_state, restore_ahead
from .engine import Engine, RankLog
from ..plan.steps import generated_ahead

_CACHE: GroupCache | None = None


def process_cache(timeout_s: float) -> GroupCache:
    """This process's one GroupCache. It outlives a run on purpose: on gloo, destroying a group and
    making the same ranks' group again later hangs (meshrl/parallel/groups.py), and a test's rank
    pool runs many plans in one process."""
    global _CACHE
    if _CACHE is None:
        _CACHE = GroupCache(timeout_s)
    return _CACHE


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
    from torch.distributed import distributed_c10d as c10d

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
    from ..plan.problem import model_for

    graph = graph_of(cfg)
    return [model_for(getattr(cfg.models, role), role) for role in graph.roles()]


def _complete_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl, without a last line cut short by a kill."""
    import json

    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def record_of(t: int, logs: list[RankLog], wall_s: float) -> dict:
    """One metrics record: the reported stats, then timings (slowest rank per step) under time/.

    ``time/runtime/overhead_frac``: the part of the iteration that the busiest rank did not spend
    inside calls (reallocations, transfers, waiting and dispatch)."""
    rec: dict = {"iteration": t}
    for lg in logs:
        rec.update(lg.stats)
    for lg in logs:  # evaluations: each replica's part of the mean (algo/evaluate.py)
        for k, v in lg.sums.items():
            rec[k] = rec.get(k, 0.0) + v
    timing: dict[str, float] = {}
    for lg in logs:
        for k, v in lg.seconds.items():
            timing[k] = max(timing.get(k, 0.0), v)
    busiest = max((sum(v for k, v in lg.seconds.items() if k.startswith("time/call/")) for lg in logs), default=0.0)
    rec.update(sorted(timing.items()))
    peaks: dict[str, float] = {}  # per call, the busiest rank's peak memory (when measured)
    for lg in logs:
        for k, v in getattr(lg, "memory", {}).items():
            peaks[k] = max(peaks.get(k, 0.0), v)
    rec.update((f"perf/mem_gib/{k}", v / 2**30) for k, v in sorted(peaks.items()))
    rec["time/iteration"] = wall_s
    tokens = max((lg.tokens for lg in logs), default=0.0)
    if tokens and wall_s > 0:
        rec["perf/tokens_per_s"] = tokens / wall_s
    rec["time/runtime/overhead_frac"] = max(0.0, 1.0 - busiest / wall_s) if wall_s > 0 else 0.0
    return rec


def build(cfg: Config, plan: ExecutionPlan, out: str | None, start: int, timeout_s: float,
          log: Callable[[str], None], status: Path | None) -> tuple[Engine, bool]:
    """This rank's engine for ``plan`` from iteration ``start`` (start > 0: the newest checkpoint in
    ``out`` read under this plan, whatever plan and world wrote it). Also returns whether the
    generation of iteration ``start`` ran before the checkpoint (async), so is not run again."""
    from .checkpoint import latest_checkpoint, load_checkpoint

    kv = {m.num_key_value_heads for m in model_configs(cfg)}
    make_groups(process_cache(timeout_s), plan_groups(plan, kv))
    engine = Engine(cfg, plan, process_cache(timeout_s), timeout_s, log, status, warm=start == 0, out=out)
    if start == 0:
        return engine, False
    ck = latest_checkpoint(out)
    saved, early = load_checkpoint(ck, engine.roles, plan.to_json()) if ck is not None else (None, None)
    if saved != start - 1:
        raise RuntimeError(f"rank {dist.get_rank()}: no checkpoint of iteration {start - 1} in {out}")
    if early is not None:
        restore_ahead(engine, early, start)
    return engine, early is not None


def rank_main(cfg: Config, plan: ExecutionPlan, out: str | None, start: int = 0, timeout_s: float = 300.0,
              status_dir: str | None = None, quiet: bool = False, save_every: int = 1, progress: bool = False
              ) -> list[dict] | None:
    """Run iterations ``start`` .. cfg.train.iterations-1 on this rank (start > 0: resume from the
    newest checkpoint in ``out``). Returns the metrics records on rank 0 (None elsewhere).
    ``quiet``: no console lines; ``progress``: a progress bar on rank 0. With ``out``, rank 0 also
    writes metrics.jsonl and trace.json, all ranks write a checkpoint every ``save_every``
    iterations and at the end, and the trained model is exported to ``out/actor`` (``out/reward`` for rm)."""
    import time

    from ..algo.iteration import console_keys
    from ..observe.metrics import MetricsWriter, no_signal_note, summary_line
    from . import replan
    from .checkpoint import export_trained, save_checkpoint

    rank = dist.get_rank()
    log: Callable[[str], None] = print if rank == 0 and not quiet else (lambda _: None)
    status = Path(status_dir) / f"rank{rank}" if status_dir else None
    engine, ahead = build(cfg, plan, out, start, timeout_s, log, status)
    records: list[dict] = []
    trace = Trace(dist.get_world_size(), f"meshrl {cfg.algo} / {plan.strategy}")
    writer = None
    if out is not None and rank == 0:
        kept = [r for r in _complete_records(Path(out) / "metrics.jsonl") if r["iteration"] < start] \
            if start > 0 else []
        writer = MetricsWriter(out)  # starts the file afresh: keep what precedes start
        for r in kept:
            writer.write(r)
    last = [time.time()]
    last_cpu = [time.process_time()]  # this rank's process (the whole job when it runs one rank)
    noted: list[int] = []  # the no-signal note is given once

    pending: dict[str, float] = {}  # rank 0: a re-plan's figures, for the next record
    since = [0]  # rank 0: index in ``records`` of the current plan's first iteration

    def on_end(t: int, logs: list[RankLog] | None) -> None:
        if logs is not None:
            report(t, logs)
        due = out is not None and replan.due(cfg, t)  # a switch goes through the checkpoint
        if out is not None and ((t + 1) % save_every == 0 or t + 1 == cfg.train.iterations or due):
            early = generated_ahead(engine.graph, cfg.train.off_policy, t, cfg.train.iterations)
            save_checkpoint(out, t, engine.roles, plan.to_json(),  # after the metrics it covers
                            ahead=ahead_state(engine, t + 1) if early else None, timeout_s=timeout_s)
        if due:
            t0 = time.time()
            d = replan.decide(cfg, plan, records[since[0]:], t) if rank == 0 else None
            d = comm.broadcast_object(d, 0, comm.control(None))  # rank 0's decision, on every rank
            log(replan.line(d, cfg.replan.min_gain))
            if d.plan_json is not None:
                raise replan.Switch(ExecutionPlan.from_json(d.plan_json), t + 1, d, t0)
            pending.update(replan.metrics(d, time.time() - t0))

    def report(t: int, logs: list[RankLog]) -> None:
        now = time.time()
        rec = record_of(t, logs, now - last[0])
        cpu = time.process_time()
        rec["time/iteration_cpu"] = cpu - last_cpu[0]  # rank 0's CPU seconds (steadier on a shared machine)
        last_cpu[0] = cpu
        rec.update(pending)
        pending.clear()
        last[0] = now
        records.append(rec)
        for r, lg in enumerate(logs):
            for name, kind, s, d in lg.events:
                trace.add(r, name, kind, s, d, t)
        if writer is not None:
            writer.write(rec)
            trace.save(Path(out) / "trace.json")
        log(summary_line(rec, console_keys(cfg.algo)))  # the demo's line (time/ figures: metrics.jsonl)
        note = no_signal_note(rec) if not noted else None
        if note:
            noted.append(t)
            log(note)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(reward=f"{rec.get('reward/mean', float('nan')):.3f}")

    bar = None
    if progress and rank == 0 and not quiet:
        from tqdm import tqdm

        bar = tqdm(total=cfg.train.iterations, initial=start, desc=f"{cfg.algo} / {plan.strategy}")
        log = bar.write
    log(f"{cfg.algo}: calls {' -> '.join(engine.graph.names)}")
    comm.barrier(comm.control(None))  # iteration timing starts when every rank has built its models
    last[0], last_cpu[0] = time.time(), time.process_time()
    while True:
        try:
            engine.run(start, cfg.train.iterations, on_end, ahead=ahead)
            break
        except replan.Switch as sw:
            switch = sw
        # every rank, at the same boundary: drop this plan's models, build the new plan's and read
        # the checkpoint just written under it (the resharding resume, in these processes)
        engine = None
        plan, start = switch.plan, switch.start
        engine, ahead = build(cfg, plan, out, start, timeout_s, log, status)
        comm.barrier(comm.control(None))
        if rank == 0:
            (Path(out) / "plan.json").write_text(plan.to_json())
            dur = time.time() - switch.t0
            trace.add(0, "replan", "replan", switch.t0, dur, switch.decision.after)
            pending.update(replan.metrics(switch.decision, dur))
            since[0] = len(records)
            from .job import plan_table

            log(plan_table(plan, cfg.train.off_policy))
        last[0], last_cpu[0] = time.time(), time.process_time()
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close()
    if out is not None:
        export_trained(engine.roles, cfg.algo, out, engine.tok)
    return records if rank == 0 else None
