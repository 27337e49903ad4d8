"""The SPMD engine: every rank walks the same global order of steps and does the ones that include it.

    roles = build_roles(...)                      # home ParallelModels (+ copies that stay)
    for step in with_evals(steps(graph, plan, ...)):  # identical order on every rank
        if rank in step.ranks: do(step)            # call | realloc | transfer | eval
        if step is an end: yield Finished(t, logs)  # the iteration, to the run's loop (runtime/run.py)

Data lives per iteration: ``store[t]`` holds the whole-batch tensors this rank has (the dataset's
keys, computed locally from (seed, iteration), plus every producer's output it received);
``held[(call, t)]`` holds the rows of the dp replica whose output this rank holds. At the end of an
iteration every rank hands its statistics, timings and trace events to rank 0 (one gather_object),
and ``iterate`` yields the finished iteration; the run's loop reports it, checkpoints and maybe
re-plans (runtime/run.py).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from .. import interrupt
from ..algo import setup
from ..algo.batch import Batch
from ..algo.common import CallContext
from ..algo.calls import Place, row_wise
from ..algo.dispatch import implementation
from ..algo.demo_evals import Evaluation, evaluations
from ..algo.graph import Graph, graph_of
from ..algo.partial import STREAM_KEYS
from ..algo.iteration import RL_ALGOS, dataset, iteration_batch, rollout_metrics
from ..algo.registry import tensor_keys
from ..config import Config
from ..parallel.groups import GroupCache
from ..parallel import comm
from . import evals, memory, stream
from ..plan.execution_plan import ExecutionPlan
from ..plan.steps import Step, report_rank, steps, temporary
from .roles import RoleModels, build_roles, initial_states
from .transfer import exchange
from .evals import with_evals
from .warmup import remove_temporary, warmup_dir, warmup_sharded


@dataclass
class RankLog:
    """What one rank measured in one iteration: stats it reports, seconds per step, trace events."""

    stats: dict[str, float] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)  # parts of a figure that rank 0 adds up
    tokens: float = 0.0  # real tokens of the iteration's batch (the train calls' reporting ranks)
    seconds: dict[str, float] = field(default_factory=dict)
    events: list[tuple[str, str, float, float]] = field(default_factory=list)  # (name, kind, start, dur)
    memory: dict[str, float] = field(default_factory=dict)  # call -> peak bytes (runtime/memory.py)


@dataclass
class Finished:
    """An iteration the walk has just ended: its number, and every rank's log on rank 0 (None elsewhere)."""

    iteration: int
    logs: list[RankLog] | None


class Engine:
    """One rank's view of a run of ``cfg`` under ``plan``."""

    def __init__(self, cfg: Config, plan: ExecutionPlan, cache: GroupCache, timeout_s: float = 300.0,
                 log: Callable[[str], None] = print, status: Path | None = None, warm: bool = True,
                 out: str | Path | None = None, hook: Callable[[str, int], None] | None = None) -> None:
        """``warm``: run the SFT warm-up first when the config asks for one (not when resuming);
        it is kept in ``out``/sft-warmup (runtime/warmup.py). ``hook(step name, iteration)`` is
        called as this rank enters each step (the tests' fault injection, runtime/faults.py)."""
        self.cfg, self.plan, self.timeout = cfg, plan, timeout_s
        self.rank, self.log, self.status, self.hook = dist.get_rank(), log, status, hook
        if status is not None:
            status.write_text("building the models")
        self.graph: Graph = graph_of(cfg)
        self.tok = setup.tokenizer_for(cfg)
        self.data = dataset(cfg, self.tok)  # prompts (RL), SFT sequences or preference pairs
        warmed, temporary = None, False
        if warm and setup.warms_up(cfg):
            if status is not None:
                status.write_text("SFT warm-up")
            warmed, temporary = warmup_dir(out)
            warmup_sharded(cfg, self.tok, cache, warmed, log, timeout_s)
        self.roles: dict[str, RoleModels] = build_roles(cfg, self.graph, plan, initial_states(cfg, warmed),
                                                        cache, timeout_s)
        if temporary:
            remove_temporary(warmed, timeout_s)
        self.evals: list[Evaluation] = evaluations(cfg, self.tok)
        self.store: dict[int, Batch] = {}
        self.held: dict[tuple[str, int], Batch] = {}
        self.logs: dict[int, RankLog] = {}

    # ---- the walk -------------------------------------------------------------------------
    def iterate(self, start: int, stop: int, ahead: int = 0) -> Iterator[Finished]:
        """Walk iterations start..stop-1, yielding each one as it ends: on every rank, with all
        ranks' logs on rank 0. With async generation the next iteration's generation may have run
        already (its outputs are in ``held``). ``ahead``: the generations of this many iterations
        from ``start`` on are already in ``held`` (restored from a checkpoint), so they are not run
        again. Leaving the loop early (a re-plan) leaves the rest of the order unwalked."""
        k = self.cfg.train.off_policy
        order = steps(self.graph, self.plan, start, stop, k, ahead, self.cfg.stream_steps_at(k))
        for step in with_evals(order, self.cfg, self.evals, start, stop, dist.get_world_size()):
            interrupt.check()  # a Ctrl-C that Python dropped stops the run here (meshrl/interrupt.py)
            if self.rank not in step.ranks:
                continue
            if self.status is not None:  # where the launcher reads it if this rank dies (names the step)
                self.status.write_text(f"step '{step.name}' of iteration {step.iteration}")
            if self.hook is not None:
                self.hook(step.name, step.iteration)
            if step.kind == "end":
                yield Finished(step.iteration, self._gather(step.iteration))
                continue
            t0 = time.time()
            self._guarded(step)
            lg = self.logs.setdefault(step.iteration, RankLog())
            dur = time.time() - t0
            label = step.name.split(" ", 1)[-1]
            key = f"time/{step.kind}/{label}"
            lg.seconds[key] = lg.seconds.get(key, 0.0) + dur
            lg.events.append((step.name, step.kind, t0, dur))

    def _guarded(self, step: Step) -> None:
        """The step; a failure names the rank, step and iteration (with the traceback in the status file)."""
        try:
            self._do(step)
        except Exception as e:
            if self.status is not None:
                self.status.write_text(f"failed in step '{step.name}' of iteration {step.iteration}:\n"
                                       + traceback.format_exc())
            raise RuntimeError(f"rank {self.rank} failed in step '{step.name}' of iteration "
                               f"{step.iteration}: {type(e).__name__}: {e}") from e

    def _do(self, step: Step) -> None:
        if step.role and self.roles[step.role].offloaded:
            self.roles[step.role].reload()  # before a call or a reallocation reads the weights
        if step.kind == "call":
            self._measured_call(step)
            if self._temporary(step.call):
                self.roles[step.role].drop(self.plan.calls[step.call].placement)
            if self.plan.offload_frozen and self._shared(step.call):
                self.roles[step.role].offload(self.plan.calls[step.call].placement)
        elif step.kind == "realloc":
            t0 = time.perf_counter()
            sent = self.roles[step.role].refresh(self.plan.calls[step.call].placement, self.rank, self.timeout)
            if self.graph.call(step.call).kind == "generate":  # the generation engines' weights moving
                self._weight_sync(step.iteration, time.perf_counter() - t0, sent)
        elif step.kind == "transfer":
            self._transfer(step)
        elif step.call == "held-out":
            self.logs.setdefault(step.iteration, RankLog()).stats.update(
                evals.held_out(self.cfg, self.roles, self.tok, self.rank, step.iteration))
        else:
            sums = self.logs.setdefault(step.iteration, RankLog()).sums
            for k, v in evals.demo(self.cfg, self.evals, self.roles, self.tok, self.rank, step.iteration).items():
                sums[k] = sums.get(k, 0.0) + v

    def _measured_call(self, step: Step) -> None:
        """The call, with the rank's peak memory in it when validation asks (runtime/memory.py: on a
        CPU only in iteration 0, whose times the comparison skips)."""
        dev = comm.compute_device()
        if not memory.enabled() or (dev.type != "cuda" and step.iteration != 0):
            self._call(step)
            return
        box: dict = {}
        with memory.call_peak(self.roles, dev, box):
            self._call(step)
        lg = self.logs.setdefault(step.iteration, RankLog())
        lg.memory[step.call] = max(lg.memory.get(step.call, 0.0), box["peak"])

    def _weight_sync(self, t: int, seconds: float, nbytes: int) -> None:
        """time/weight_sync (slowest rank) and weight_sync/bytes (all ranks) of iteration t: the
        reallocation into the generation placement plus the load into the backend's engines."""
        lg = self.logs.setdefault(t, RankLog())
        lg.seconds["time/weight_sync"] = lg.seconds.get("time/weight_sync", 0.0) + seconds
        lg.sums["weight_sync/bytes"] = lg.sums.get("weight_sync/bytes", 0.0) + nbytes

    def _temporary(self, name: str) -> bool:
        """Whether the call's copy of its role is dropped after the call (plan/steps.py ``temporary``)."""
        return temporary(self.graph, self.plan, name)

    def _shared(self, name: str) -> bool:
        """Whether another role's call uses some of this call's ranks (so offloading frees memory
        that call can use)."""
        call = self.graph.call(name)
        mine = set(self.plan.calls[name].mesh.ranks)
        return any(c.role != call.role and mine & set(self.plan.calls[c.name].mesh.ranks) for c in self.graph.calls)

    def _batch(self, t: int) -> Batch:
        if t not in self.store:
            self.store[t] = iteration_batch(self.data, self.cfg, t)
        return self.store[t]

    def _call(self, step: Step) -> None:
        if step.stream:  # streaming generation: segments of the batches in flight (runtime/stream.py)
            stream.run(self, step)
            return
        call, t = self.graph.call(step.call), step.iteration
        pl = self.plan.calls[call.name].placement
        role = self.roles[call.role]
        h = role.handle(pl)
        dp_i, _, pp_i = pl.coords_of(self.rank)
        place = Place(dp_i, pl.layout.dp, self.plan.calls[call.name].micro_batches,
                      holds_output=pp_i == pl.layout.pp - 1,
                      sum_replicas=_sum_over(h.groups.dp.group) if h is not None else None)
        if call.kind == "generate":  # the backend's engine (meshrl/gen), with its weight sync
            h, sync_s, sync_bytes = role.rollout(pl, t)
            self._weight_sync(t, sync_s, sync_bytes)
        ctx = CallContext(self.cfg, t, self.tok)
        batch = self._batch(t).only(tensor_keys(call.inputs))
        fn = implementation(call, self.cfg.algo)
        if row_wise(call):
            part = batch.split(pl.layout.dp)[dp_i]
            place.micro_batches = min(place.micro_batches, len(part))
            out = fn(h, part, ctx, place)
            if self.rank == pl.holders()[dp_i]:
                self.held[(call.name, t)] = out
            return
        stats = fn(h, batch, ctx, place)
        if self.rank == report_rank(self.plan, call.name):
            lg = self.logs.setdefault(t, RankLog())
            lg.stats.update(stats)
            lg.tokens = float(batch.tokens().sum())
            if call.role == "actor" and self.cfg.algo in RL_ALGOS:
                streamed = {k: self._batch(t)[k] for k in STREAM_KEYS if k in self._batch(t)}  # token versions
                lg.stats.update(rollout_metrics(batch.with_(**streamed), self.cfg, t))

    def _transfer(self, step: Step) -> None:
        t = step.iteration
        parts = {d: self.held[(step.src_call, t)] for d, s in enumerate(step.senders) if s == self.rank}
        merged, _ = exchange(parts, step.senders, step.receivers, self.rank, self.timeout)
        if merged is not None:
            self.store[t] = self._batch(t).with_(**merged.data)

    def _gather(self, t: int) -> list[RankLog] | None:
        """Every rank's log of iteration t to rank 0; drops the iteration's data."""
        mine = self.logs.pop(t, RankLog())
        self.store.pop(t, None)
        for key in [k for k in self.held if k[1] == t]:
            del self.held[key]
        out: list[RankLog] | None = [RankLog()] * dist.get_world_size() if self.rank == 0 else None
        comm.gather_object(mine, out, 0, comm.control(None))
        return out


def _sum_over(group) -> Callable[[list[float]], list[float]] | None:
    """The replicas' float64 stats summed over ``group``'s control twin (None: nothing to sum over)."""
    if group is None:
        return None
    return lambda values: comm.reduce_floats(values, group)
