"""What every rank runs for ``meshrl train --nprocs N`` (or under torchrun): build the engine, walk
the iterations, and on rank 0 turn the ranks' logs into one metrics record per iteration, a
console line, trace.json, and checkpoints (meshrl/runtime/checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from ..config import Config
from ..observe.trace import Trace
from ..parallel.groups import GroupCache
from ..plan.execution_plan import ExecutionPlan
from .engine import Engine, RankLog

_CACHE: GroupCache | None = None


def process_cache(timeout_s: float) -> GroupCache:
    """This process's one GroupCache. It outlives a run on purpose: on gloo, destroying a group and
    making the same ranks' group again later hangs (meshrl/parallel/groups.py), and a test's rank
    pool runs many plans in one process."""
    global _CACHE
    if _CACHE is None:
        _CACHE = GroupCache(timeout_s)
    return _CACHE


def record_of(t: int, logs: list[RankLog], wall_s: float) -> dict:
    """One metrics record: the reported stats, then timings (slowest rank per step) under time/.

    ``time/runtime/overhead_frac``: the part of the iteration that the busiest rank did not spend
    inside calls (reallocations, transfers, waiting and dispatch)."""
    rec: dict = {"iteration": t}
    for lg in logs:
        rec.update(lg.stats)
    timing: dict[str, float] = {}
    for lg in logs:
        for k, v in lg.seconds.items():
            timing[k] = max(timing.get(k, 0.0), v)
    busiest = max((sum(v for k, v in lg.seconds.items() if k.startswith("time/call/")) for lg in logs), default=0.0)
    rec.update(sorted(timing.items()))
    rec["time/iteration"] = wall_s
    rec["time/runtime/overhead_frac"] = max(0.0, 1.0 - busiest / wall_s) if wall_s > 0 else 0.0
    return rec


def rank_main(cfg: Config, plan: ExecutionPlan, out: str | None, start: int = 0, timeout_s: float = 300.0,
              status_dir: str | None = None, quiet: bool = False) -> list[dict] | None:
    """Run iterations ``start`` .. cfg.train.iterations-1 on this rank. Returns the metrics records
    on rank 0 (None elsewhere); ``quiet``: no console lines. With ``out``, rank 0 also writes
    metrics.jsonl and trace.json."""
    import time

    from ..observe.metrics import MetricsWriter, summary_line

    rank = dist.get_rank()
    log: Callable[[str], None] = print if rank == 0 and not quiet else (lambda _: None)
    status = Path(status_dir) / f"rank{rank}" if status_dir else None
    engine = Engine(cfg, plan, process_cache(timeout_s), timeout_s, log, status)
    records: list[dict] = []
    trace = Trace(dist.get_world_size(), f"meshrl {cfg.algo} / {plan.strategy}")
    writer = MetricsWriter(out, tensorboard=False) if out is not None and rank == 0 else None
    last = [time.time()]

    def on_end(t: int, logs: list[RankLog] | None) -> None:
        if logs is None:
            return
        now = time.time()
        rec = record_of(t, logs, now - last[0])
        last[0] = now
        records.append(rec)
        for r, lg in enumerate(logs):
            for name, kind, s, d in lg.events:
                trace.add(r, name, kind, s, d, t)
        if writer is not None:
            writer.write(rec)
            trace.save(Path(out) / "trace.json")
        log(summary_line(rec, ("reward/mean", "kl/k1", "actor/pg_loss", "critic/vf_loss", "time/iteration")))

    dist.barrier()  # iteration timing starts when every rank has built its models
    last[0] = time.time()
    engine.run(start, cfg.train.iterations, on_end)
    if writer is not None:
        writer.close()
    return records if rank == 0 else None
