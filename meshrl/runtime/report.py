"""What a run reports: rank 0 turns the ranks' logs of each finished iteration into one metrics
record (metrics.jsonl, TensorBoard), a console line, and trace.json events. ``Reporter`` holds that
state (the records, the clocks, the writer, the trace) for the run's loop (runtime/run.py); on the
other ranks it only keeps the clocks.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from ..algo.iteration import console_keys
from ..config import Config
from ..observe.metrics import MetricsWriter, no_signal_note, summary_line
from ..observe.trace import Trace
from ..plan.execution_plan import ExecutionPlan
from . import replan
from .plans import plan_table
from .engine import Finished, RankLog


def complete_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl, without a last line cut short by a kill."""
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
    for lg in logs:  # evaluations: each replica's part of the mean (algo/demo_evals.py)
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
        for k, v in lg.memory.items():
            peaks[k] = max(peaks.get(k, 0.0), v)
    rec.update((f"perf/mem_gib/{k}", v / 2**30) for k, v in sorted(peaks.items()))
    rec["time/iteration"] = wall_s
    tokens = max((lg.tokens for lg in logs), default=0.0)
    if tokens and wall_s > 0:
        rec["perf/tokens_per_s"] = tokens / wall_s
    rec["time/runtime/overhead_frac"] = max(0.0, 1.0 - busiest / wall_s) if wall_s > 0 else 0.0
    return rec


def _silent(_: str) -> None:
    """The console of a rank that prints nothing."""


@dataclass
class Reporter:
    """One rank's reporting state across the run (and across its re-plans)."""

    cfg: Config
    out: Path | None  # rank 0 with an output directory: metrics.jsonl and trace.json go there
    trace: Trace
    lead: bool  # rank 0: it holds every rank's logs, writes and prints
    log: Callable[[str], None] = _silent
    writer: MetricsWriter | None = None
    bar: tqdm | None = None
    records: list[dict] = field(default_factory=list)
    since: int = 0  # index in ``records`` of the current plan's first iteration
    pending: dict[str, float] = field(default_factory=dict)  # a re-plan's figures, for the next record
    noted: bool = False  # the no-signal note is given once
    last: float = 0.0  # wall clock at the end of the previous iteration
    last_cpu: float = 0.0  # this process's CPU clock then (the whole job when it runs one rank)

    @classmethod
    def open(cls, cfg: Config, plan: ExecutionPlan, out: str | None, start: int, world: int, rank: int,
             console: bool, progress: bool) -> Reporter:
        """A reporter from iteration ``start``; on rank 0 with ``out`` the metrics file starts afresh
        with the records that precede ``start`` (a resume)."""
        rep = cls(cfg, Path(out) if out is not None and rank == 0 else None,
                  Trace(world, f"meshrl {cfg.algo} / {plan.strategy}"), rank == 0)
        if console:
            rep.log = print
        if console and progress:
            # a thread lock, not tqdm's default multiprocessing one: a rank killed after a failure
            # elsewhere then leaves no semaphore behind for the resource tracker to report
            tqdm.set_lock(threading.RLock())
            rep.bar = tqdm(total=cfg.train.iterations, initial=start, desc=f"{cfg.algo} / {plan.strategy}")
            rep.log = rep.bar.write
        if rep.out is not None:
            kept = [r for r in complete_records(rep.out / "metrics.jsonl") if r["iteration"] < start]
            rep.writer = MetricsWriter(rep.out)
            for r in kept if start > 0 else []:
                rep.writer.write(r)
        return rep

    def begin(self, plan: ExecutionPlan, switch: replan.Decision | None) -> None:
        """The clocks start (every rank has built its models); after a re-plan, rank 0 records it."""
        if switch is not None and self.out is not None:
            (self.out / "plan.json").write_text(plan.to_json())
        if switch is not None and self.lead:
            dur = time.time() - switch.t0
            self.trace.add(0, "replan", "replan", switch.t0, dur, switch.after)
            self.pending.update(replan.metrics(switch, dur))
            self.since = len(self.records)
            self.log(plan_table(plan, self.cfg.train.off_policy))
        self.last, self.last_cpu = time.time(), time.process_time()

    def report(self, it: Finished) -> None:
        """Iteration ``it``'s record (rank 0: the ranks' logs are there), console line and trace."""
        now, cpu = time.time(), time.process_time()
        wall, self.last = now - self.last, now
        cpu_s, self.last_cpu = cpu - self.last_cpu, cpu
        if it.logs is None:
            return
        rec = record_of(it.iteration, it.logs, wall)
        rec["time/iteration_cpu"] = cpu_s  # rank 0's CPU seconds (steadier on a shared machine)
        rec.update(self.pending)
        self.pending.clear()
        self.records.append(rec)
        for r, lg in enumerate(it.logs):
            for name, kind, s, d in lg.events:
                self.trace.add(r, name, kind, s, d, it.iteration)
        if self.writer is not None:
            self.writer.write(rec)
            self.trace.save(self.out / "trace.json")
        self.log(summary_line(rec, console_keys(self.cfg.algo)))  # time/ figures: metrics.jsonl only
        note = None if self.noted else no_signal_note(rec)
        if note:
            self.noted = True
            self.log(note)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{rec.get('reward/mean', float('nan')):.3f}")

    def decided(self, d: replan.Decision | None) -> None:
        """A re-plan decision (every rank has it): its console line; when staying, its figures."""
        if d is None:
            return
        self.log(replan.line(d, self.cfg.replan.min_gain))
        if d.plan_json is None:
            self.pending.update(replan.metrics(d, time.time() - d.t0))

    def plan_records(self) -> list[dict]:
        """The records of the iterations run under the current plan (rank 0)."""
        return self.records[self.since:]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
