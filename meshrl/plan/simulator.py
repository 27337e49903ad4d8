"""The iteration timeline of a plan: list scheduling of calls, reallocations and data transfers.

The runtime is SPMD: every rank walks one global order of steps and runs the steps whose meshes
include it. The simulator prices that very list (meshrl/plan/steps.py ``steps``), so what it
predicts is what the runtime does: a step starts when its dependencies are done and every one of
its devices has finished the steps before it in the global order (each device runs one step at a
time).

Steps per iteration t, in graph order (the rules are steps.py's):
- ``realloc``: before a call whose role's weights live elsewhere (a trained role lives in its train
  call's layout; a frozen role in its first call's). It reads the weights written by the role's
  train call of iteration t-1, or t-2 for generation under ``train.off_policy=1`` (one step off-policy).
  The disaggregated strategy's shadow-actor refresh is exactly this step.
- ``transfer``: a producer's outputs moving to a consumer on another mesh or DP split.
- ``call``: after its parents (and their transfers) and its realloc.
- ``end``: the end of the iteration, on every device, taking no time: the runtime's ranks hand their
  statistics to rank 0 there (``gather_object``, whose size exchange is an all-gather), so no rank
  starts iteration t+1's steps before every rank has finished iteration t's.
With ``train.off_policy=k``, the generation steps of iteration t+k come before the rest of iteration t in
the global order, so generation overlaps training.

What a plan scores: the mean time of ``ITERATIONS`` iterations in their steady state. Lag 0 (the
default) simulates just those iterations from a cold start, as ReaL scores a plan. Lag k first runs
k generations with no training beside them, and its last k iterations generate nothing (their
samples were made ahead): neither happens in a long run, so k > 0 simulates ITERATIONS + 2k
iterations and scores the ITERATIONS in the middle, from the end of iteration k-1 to the end of
iteration ITERATIONS+k-1 (each of them overlaps a generation k ahead, as in a long run). At k = 0
the two are the same number, so lags compare with each other fairly (meshrl/plan/lag.py).

Shared cores (CPU profiles only): ranks of one node that compute at once share its cores. Then a
step runs at rate 1 / slowdown(busy ranks on its node), the measured curve of the profile; a call
counts as many busy ranks as compute at once (``Estimate.active``: a pipeline's stages idle in its
bubble and, in generation, while a micro-batch's tokens travel back)
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
from .steps import steps

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
    """A simulated run scoring ``iterations`` iterations. ``iteration_s`` is their mean time: the
    makespan / iterations at lag 0 (a cold start included, as a real run of that many iterations);
    under train.off_policy=k > 0 the steady-state ``window`` (see the module docstring)."""

    events: list[Event]
    iterations: int
    n_devices: int
    makespan: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)  # device-seconds per event name, iteration 1
    window: tuple[float, float] | None = None  # (start, end) of the scored iterations; None: the makespan

    @property
    def iteration_s(self) -> float:
        start, end = self.window or (0.0, self.makespan)
        return (end - start) / self.iterations

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
        import matplotlib  # only to draw (slow; the planner stays light)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # only to draw (slow; the planner stays light)

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
    """The runtime's global order of steps (meshrl/plan/steps.py ``steps``) for ``iterations``
    iterations, priced: each step gets its duration and the earlier events it waits for.

    ``free`` (for lower bounds on partial plans): calls not in the plan, given as a duration; each
    is a step on no device, and the realloc and transfer steps that touch it are left out.
    Every step time of a list schedule only grows with durations and devices, so this bounds the
    time of every completion of the partial plan from below. Steps priced at zero (a transfer or a
    reallocation that moves nothing the estimator counts) are left out: their consumer waits for
    the producer directly."""
    free = free or {}
    graph = problem.graph
    events: list[Event] = []
    done: dict[tuple[str, int], int] = {}  # (call name, iteration) -> event index
    moved: dict[tuple[str, str, int], int] = {}  # (producer, consumer, iteration) -> transfer event
    realloc: dict[tuple[str, int], int] = {}  # (call, iteration) -> its reallocation event

    def emit(ev: Event) -> int:
        events.append(ev)
        return len(events) - 1

    def weight_deps(c, t: int) -> list[int]:
        """The update whose weights call c of iteration t reads: the role's train call of t-1, or of
        t-2 for generation one step off-policy; a train call waits for its own previous step."""
        deps = []
        lag = 1 + (problem.off_policy if c.kind == "generate" else 0)
        writer = problem.train_call.get(c.role)
        if writer is not None and writer != c.name and (writer, t - lag) in done:
            deps.append(done[(writer, t - lag)])
        if writer == c.name and (c.name, t - 1) in done:
            deps.append(done[(c.name, t - 1)])
        return deps

    for st in steps(graph, plan, 0, iterations, problem.off_policy):
        t = st.iteration
        if st.kind == "end":
            emit(Event(st.name, "end", t, st.ranks, 0.0))
        elif st.kind == "realloc":
            c = graph.call(st.call)
            home = plan.calls[problem.home(plan, c.role)]
            dur = problem.realloc_time(c.role, home.placement, plan.calls[c.name].placement)
            if dur > 0:
                realloc[(c.name, t)] = emit(Event(st.name, "realloc", t, st.ranks, dur, tuple(weight_deps(c, t))))
        elif st.kind == "transfer":
            p, c = st.src_call, st.call
            dur = problem.transfer_time(p, c, plan.calls[p], plan.calls[c])
            if dur > 0:
                moved[(p, c, t)] = emit(Event(st.name, "transfer", t, st.ranks, dur, (done[(p, t)],)))
        else:
            c = graph.call(st.call)
            parents = [moved.pop((p, c.name, t), done[(p, t)]) for p in graph.parents(c.name)]
            if c.name in free:
                done[(c.name, t)] = emit(Event(c.name, "call", t, (), free[c.name], tuple(parents)))
                continue
            cp = plan.calls[c.name]
            own = realloc.pop((c.name, t), None)
            deps = ([own] if own is not None else weight_deps(c, t)) + parents
            est = problem.call_estimate(c.name, cp)
            done[(c.name, t)] = emit(Event(c.name, "call", t, cp.mesh.ranks, est.time_s, tuple(deps),
                                           active=est.active))
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
    k = problem.off_policy
    events = build_events(problem, plan, iterations + 2 * k)
    share = sharing(problem)
    makespan = schedule(events, problem.cluster.size, share)
    busy: dict[str, float] = {}
    for e in events:
        if e.iteration == k + min(1, iterations - 1):  # device-seconds as run (stretched where cores are shared)
            span = e.duration if share is None else e.end - e.start
            busy[e.name] = busy.get(e.name, 0.0) + span * len(e.devices)
    return Timeline(events, iterations, problem.cluster.size, makespan, busy, _window(events, k, iterations))


def _window(events: list[Event], k: int, iterations: int) -> tuple[float, float] | None:
    """(end of iteration k-1, end of iteration iterations+k-1): the steady-state iterations of a
    run simulated with lag k > 0 (module docstring); None at lag 0 (the whole makespan)."""
    if not k:
        return None
    ends = {e.iteration: e.end for e in events if e.kind == "end"}
    return ends[k - 1], ends[iterations + k - 1]


def iteration_time(problem: Problem, plan: ExecutionPlan, iterations: int = ITERATIONS,
                   free: dict[str, float] | None = None) -> float:
    """The search's objective: the mean steady-state iteration time of the simulated run (a lower
    bound when ``free`` stands in for calls the partial ``plan`` lacks; exact bounds hold at lag 0,
    where the score is the makespan, the only case the exhaustive search is used for)."""
    k = problem.off_policy
    events = build_events(problem, plan, iterations + 2 * k, free)
    makespan = schedule(events, problem.cluster.size, sharing(problem))
    start, end = _window(events, k, iterations) or (0.0, makespan)
    return (end - start) / iterations
