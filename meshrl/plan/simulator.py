"""The iteration timeline of a plan: list scheduling of calls, reallocations and data transfers.

The runtime is SPMD: every rank walks one global order of steps and runs the steps whose meshes
include it. The simulator follows the same rule, so what it predicts is what the runtime does:
a step starts when its dependencies are done and every one of its devices has finished the steps
before it in the global order (each device runs one step at a time).

Steps per iteration t, in graph order:
- ``realloc``: before a call whose role's weights live elsewhere (a trained role lives in its train
  call's layout; a frozen role in its first call's). It reads the weights written by the role's
  train call of iteration t-1, or t-2 for generation under ``async_gen=1`` (one step off-policy).
  The disaggregated strategy's shadow-actor refresh is exactly this step.
- ``transfer``: a producer's outputs moving to a consumer on another mesh or DP split.
- ``call``: after its parents (and their transfers) and its realloc.
- ``end``: the end of the iteration, on every device, taking no time: the runtime's ranks hand their
  statistics to rank 0 there (``gather_object``, whose size exchange is an all-gather), so no rank
  starts iteration t+1's steps before every rank has finished iteration t's.
With ``async_gen=1``, the generation steps of iteration t+1 come before the rest of iteration t in
the global order, so generation overlaps training.

Shared cores (CPU profiles only): ranks of one node that compute at once share its cores. Then a
step runs at rate 1 / slowdown(busy ranks on its node), the measured curve of the profile; a call
counts as many busy ranks as compute at once (``Estimate.active``: pipelined generation's stages
take turns, so a pp-stage generation keeps 1 / pp of its ranks busy)
(``Hardware.slowdown``), re-evaluated whenever a step starts or ends (processor sharing, simulated
event by event); a step over several nodes goes at its slowest node's rate. ``Event.duration`` is
the step's time alone; ``end - start`` its time as run. GPU presets have no curve, and then the plain
list schedule runs, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .execution_plan import ExecutionPlan
from .problem import Problem

ITERATIONS = 5  # iterations simulated to score a plan (ReaL scores plans over 5 as well)


@dataclass
class Event:
    name: str
    kind: str  # call | realloc | transfer | end
    iteration: int
    devices: tuple[int, ...]
    duration: float
    deps: tuple[int, ...] = ()  # indices of earlier events
    active: float = 1.0  # share of its devices computing at once (Estimate.active), for shared cores
    start: float = 0.0
    end: float = 0.0


@dataclass
class Timeline:
    """A simulated run of ``iterations`` iterations. ``iteration_s`` is the mean iteration time
    (makespan / iterations, a cold start included, as a real run of that many iterations)."""

    events: list[Event]
    iterations: int
    n_devices: int
    makespan: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)  # device-seconds per event name, iteration 1

    @property
    def iteration_s(self) -> float:
        return self.makespan / self.iterations

    def to_chrome_trace(self) -> dict:
        """Chrome / Perfetto trace: one track (tid) per device, times in microseconds."""
        evs: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "meshrl plan"}}]
        for d in range(self.n_devices):
            evs.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": d, "args": {"name": f"device {d}"}})
        for e in self.events:
            for d in e.devices:
                evs.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": 0, "tid": d, "ts": e.start * 1e6,
                            "dur": max(e.end - e.start, 0.0) * 1e6, "args": {"iteration": e.iteration}})
        return {"traceEvents": evs, "displayTimeUnit": "ms"}

    def save_gantt(self, path: str, max_devices: int = 64) -> None:
        """A Gantt chart (PNG): one row per device, one colour per call or step kind."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = sorted({_label(e) for e in self.events if e.kind != "end"})
        cmap = plt.get_cmap("tab20")
        colour = {n: cmap(i % 20) for i, n in enumerate(names)}
        n_dev = min(self.n_devices, max_devices)
        fig, ax = plt.subplots(figsize=(12, 1 + 0.3 * n_dev))
        for e in self.events:
            for d in e.devices:
                if d < n_dev and e.end > e.start:
                    ax.barh(d, e.end - e.start, left=e.start, color=colour[_label(e)], edgecolor="none")
        ax.set_xlabel("seconds")
        ax.set_ylabel("device")
        ax.invert_yaxis()
        ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in names], labels=names,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        ax.set_title(f"{self.iterations} iterations, {self.iteration_s:.3g} s per iteration")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def _label(e: Event) -> str:
    return e.name if e.kind == "call" else e.kind


def build_events(problem: Problem, plan: ExecutionPlan, iterations: int = ITERATIONS,
                 free: dict[str, float] | None = None) -> list[Event]:
    """The global order of steps for ``iterations`` iterations, with durations and dependencies.

    ``free`` (for lower bounds on partial plans): calls not in the plan, given as a duration; each
    becomes a step on no device, and the realloc and transfer steps that touch it are left out.
    Every step time of a list schedule only grows with durations and devices, so this bounds the
    time of every completion of the partial plan from below."""
    free = free or {}
    graph = problem.graph
    events: list[Event] = []
    done: dict[tuple[str, int], int] = {}  # (call name, iteration) -> event index
    homes = {role: problem.home(plan, role) for role in graph.roles()}
    async_gen = plan.async_gen

    def emit(ev: Event) -> int:
        events.append(ev)
        return len(events) - 1

    moved: dict[tuple[str, str, int], int] = {}  # transfers emitted ahead of their consumer
    have: dict[tuple[str, int], set[int]] = {}  # devices that received a call's outputs (runtime/schedule.py)
    gen_calls = [c for c in graph.calls if c.kind == "generate" and not graph.parents(c.name)]
    rest = [c for c in graph.calls if c not in gen_calls]

    def emit_transfer(p: str, c, t: int) -> int:
        """The step that moves p's outputs to the devices of c that lack them (or p itself when
        nothing moves, or the move is free); its index. As the runtime: the dp holders send, and
        devices that received the outputs for an earlier consumer receive nothing again."""
        pcp, cp = plan.calls.get(p), plan.calls.get(c.name)
        if pcp is None or cp is None:
            return done[(p, t)]
        got = have.setdefault((p, t), set())
        receivers = set(cp.mesh.ranks) - got
        got |= receivers
        dur = problem.transfer_time(p, c.name, pcp, cp) if receivers else 0.0
        if dur <= 0:
            return done[(p, t)]
        devs = tuple(sorted(set(pcp.placement.holders()) | receivers))
        return emit(Event(f"transfer {p}->{c.name}", "transfer", t, devs, dur, (done[(p, t)],)))

    def hand_on(p: str, t: int) -> None:
        """p's outputs to every consumer at once (runtime/schedule.py ``_hand_on``)."""
        for k in graph.calls:
            if p in graph.parents(k.name) and k.name not in free:
                moved[(p, k.name, t)] = emit_transfer(p, k, t)

    def emit_call(c, t: int) -> None:
        if c.name in free:
            deps = [done[(p, t)] for p in graph.parents(c.name)]
            done[(c.name, t)] = emit(Event(c.name, "call", t, (), free[c.name], tuple(deps)))
            return
        cp = plan.calls[c.name]
        deps: list[int] = []
        lag = 1 + (async_gen if c.kind == "generate" else 0)
        writer = problem.train_call.get(c.role)
        if writer is not None and (writer, t - lag) in done and writer != c.name:
            deps.append(done[(writer, t - lag)])
        if writer == c.name and (c.name, t - 1) in done:
            deps.append(done[(c.name, t - 1)])
        home = plan.calls.get(homes[c.role])
        if home is not None and homes[c.role] != c.name and home.placement != cp.placement:
            dur = problem.realloc_time(c.role, home.placement, cp.placement)
            if dur > 0:
                devs = tuple(sorted(set(home.mesh.ranks) | set(cp.mesh.ranks)))
                deps = [emit(Event(f"realloc {c.role}->{c.name}", "realloc", t, devs, dur, tuple(deps)))]
        for p in graph.parents(c.name):
            ahead = moved.pop((p, c.name, t), None)
            deps.append(ahead if ahead is not None else emit_transfer(p, c, t))
        est = problem.call_estimate(c.name, cp)
        done[(c.name, t)] = emit(Event(c.name, "call", t, cp.mesh.ranks, est.time_s, tuple(deps), active=est.active))
        if not (async_gen and c in gen_calls):  # hand outputs on at once, while consumers may be idle
            hand_on(c.name, t)

    if async_gen:
        for c in gen_calls:
            emit_call(c, 0)
    for t in range(iterations):
        if async_gen:
            # Hand off this iteration's samples before generating the next ones on the same devices.
            for g in gen_calls:
                hand_on(g.name, t)
            if t + 1 < iterations:
                for c in gen_calls:
                    emit_call(c, t + 1)
        else:
            for c in gen_calls:
                emit_call(c, t)
        for c in rest:
            emit_call(c, t)
        emit(Event("end of iteration", "end", t, tuple(range(problem.cluster.size)), 0.0))
    return events


@dataclass(frozen=True)
class Sharing:
    """Devices that share a node's cores: ``per_node`` devices a node, ``slowdown(busy ranks)``."""

    per_node: int
    slowdown: Callable[[int], float]


def sharing(problem: Problem) -> Sharing | None:
    """The problem's core sharing, or None where every device is its own (GPU presets)."""
    if not problem.hw.contention:
        return None
    return Sharing(problem.cluster.devices_per_node, problem.hw.slowdown)


def schedule(events: list[Event], n_devices: int, share: Sharing | None = None) -> float:
    """List scheduling in the global order; fills start/end, returns the makespan. With ``share``
    (ranks sharing a node's cores) the steps' speeds follow the measured slowdown curve."""
    if share is not None:
        return _schedule_shared(events, n_devices, share)
    free = [0.0] * n_devices
    end = 0.0
    for e in events:
        start = max([events[i].end for i in e.deps] + [free[d] for d in e.devices] + [0.0])
        e.start, e.end = start, start + e.duration
        for d in e.devices:
            free[d] = e.end
        end = max(end, e.end)
    return end


def _schedule_shared(events: list[Event], n_devices: int, share: Sharing) -> float:
    """The same list schedule (a step starts when its dependencies and its devices' earlier steps
    are done), simulated event by event because a step's speed depends on what else runs on its
    node: between two starts or ends, each running step advances at 1 / slowdown(busy ranks)."""
    n = len(events)
    waits = [0] * n
    after: list[list[int]] = [[] for _ in range(n)]
    last = [-1] * n_devices
    for i, e in enumerate(events):
        preds = set(e.deps) | {last[d] for d in e.devices if last[d] >= 0}
        waits[i] = len(preds)
        for p in preds:
            after[p].append(i)
        for d in e.devices:
            last[d] = i
    left = [e.duration for e in events]
    ready = [i for i in range(n) if waits[i] == 0]
    running: list[int] = []
    now = 0.0
    while ready or running:
        for i in ready:
            events[i].start = now
        running += ready
        ready = []
        busy: dict[int, float] = {}
        for i in running:
            for d in events[i].devices:
                busy[d // share.per_node] = busy.get(d // share.per_node, 0.0) + events[i].active
        rate = {i: 1.0 / max([share.slowdown(busy[d // share.per_node]) for d in events[i].devices] + [1.0])
                for i in running}
        dt = min(left[i] / rate[i] for i in running)
        now += dt
        still = []
        for i in running:
            left[i] -= rate[i] * dt
            if left[i] <= 1e-12 * max(1.0, events[i].duration) or left[i] / rate[i] <= dt * 1e-9:
                events[i].end = now
                for j in after[i]:
                    waits[j] -= 1
                    if waits[j] == 0:
                        ready.append(j)
            else:
                still.append(i)
        running = still
    return max((e.end for e in events), default=0.0)


def simulate(problem: Problem, plan: ExecutionPlan, iterations: int = ITERATIONS) -> Timeline:
    events = build_events(problem, plan, iterations)
    share = sharing(problem)
    makespan = schedule(events, problem.cluster.size, share)
    busy: dict[str, float] = {}
    for e in events:
        if e.iteration == min(1, iterations - 1):  # device-seconds as run (stretched where cores are shared)
            span = e.duration if share is None else e.end - e.start
            busy[e.name] = busy.get(e.name, 0.0) + span * len(e.devices)
    return Timeline(events, iterations, problem.cluster.size, makespan, busy)


def iteration_time(problem: Problem, plan: ExecutionPlan, iterations: int = ITERATIONS,
                   free: dict[str, float] | None = None) -> float:
    """The search's objective: mean iteration time of the simulated run (a lower bound when
    ``free`` stands in for calls the partial ``plan`` lacks)."""
    return schedule(build_events(problem, plan, iterations, free), problem.cluster.size,
                    sharing(problem)) / iterations
