"""The global order of steps of a run: calls, reallocations and data transfers (pure, no torch).

This is the one definition of the order. The runtime walks it (meshrl/runtime/engine.py): every
rank computes the same list from the Graph and the ExecutionPlan and does the steps whose ranks
include it; because all ranks meet the communication steps in one order, nothing deadlocks and
calls on disjoint meshes run at the same time. The simulator prices it (meshrl/plan/simulator.py
``build_events`` adds durations and dependencies to exactly these steps). The rules:

- a trained role's *home* is its train call's placement (it holds the optimizer state); a frozen
  role's home is its first call's placement. Any other call of the role whose placement differs
  gets a copy made by a ``realloc`` step just before it (the disaggregated shadow-actor refresh is
  exactly this step);
- a call's outputs stay on its ranks (one holder per data-parallel replica); ``transfer`` steps
  right after the call move them to every consumer's ranks that do not have them yet, so the
  producer's ranks go on with their next call while the consumers' are busy elsewhere (with
  ``off_policy`` > 0 a generation's outputs are handed on at the start of their iteration, before
  the same ranks generate later ones);
- with ``off_policy=k`` (the config's ``train.off_policy``: the algorithm's choice, not the plan's)
  the generation calls of iteration t+k come before the rest of iteration t, so generation overlaps
  training and reads weights k updates old (k steps off-policy; k = 1: one step).

A call the plan lacks (the search prices partial plans) is a step on no ranks, and the
reallocations and transfers that would touch it are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..algo.graph import Call, Graph
from .execution_plan import ExecutionPlan
from .stream import Segment, advance, prologue


@dataclass(frozen=True)
class Step:
    """One step of the global order. ``ranks``: the global ranks that take part (sorted).

    kind 'call':     ``call`` runs on its mesh.
    kind 'realloc':  ``role``'s weights move from its home placement to ``call``'s placement.
    kind 'transfer': outputs of ``src_call`` (held by ``senders``, one per dp replica) reach
                     ``receivers`` (ranks of ``call`` that lack them).
    kind 'end':      the end of ``iteration`` (every rank).
    kind 'eval':     an evaluation, ``call`` = its kind (the runtime puts these in: runtime/evals.py).

    ``stream`` (a generation call under ``train.stream_steps``): the segments of the batches it
    decodes (plan/stream.py); the call's ``iteration`` is then the newest batch it touches."""

    kind: str
    iteration: int
    call: str
    ranks: tuple[int, ...]
    role: str = ""
    src_call: str = ""
    senders: tuple[int, ...] = ()
    receivers: tuple[int, ...] = ()
    stream: tuple[Segment, ...] = ()

    @property
    def name(self) -> str:
        if self.kind == "call":
            return self.call
        if self.kind == "end":
            return "end of iteration"
        if self.kind == "eval":
            return f"eval {self.call}"
        if self.kind == "realloc":
            return f"realloc {self.role}->{self.call}"
        return f"transfer {self.src_call}->{self.call}"


def home_calls(graph: Graph) -> dict[str, str]:
    """role -> the call whose placement holds the role's weights (train call, else first call)."""
    out: dict[str, str] = {}
    for c in graph.calls:
        if c.kind == "train":
            out[c.role] = c.name
    for c in graph.calls:
        out.setdefault(c.role, c.name)
    return out


def temporary(graph: Graph, plan: ExecutionPlan, name: str) -> bool:
    """Whether call ``name``'s copy of its role is dropped after the call (DESIGN.md: the realloc
    step before the role's next call there rebuilds it): a copy (not the home) that the plan does
    not keep and that is not a shadow actor (a generation copy whose devices the home does not use:
    nothing else needs that memory, and async generation reads it often)."""
    call = graph.call(name)
    home = plan.calls[home_calls(graph)[call.role]].placement
    pl = plan.calls[name].placement
    if plan.keep_copies or pl == home:
        return False
    return not (call.kind == "generate" and not set(pl.mesh.ranks) & set(home.mesh.ranks))


def _transfer(plan: ExecutionPlan, p: str, c: Call, t: int, have: dict[tuple[str, int], set[int]]) -> list[Step]:
    """The step that brings p's outputs of iteration t to the ranks of c that lack them (none if all have)."""
    if p not in plan.calls or c.name not in plan.calls:
        return []
    have_p = have.setdefault((p, t), set())
    receivers = tuple(r for r in plan.calls[c.name].mesh.ranks if r not in have_p)
    if not receivers:
        return []
    senders = plan.calls[p].placement.holders()
    have_p.update(receivers)
    return [Step("transfer", t, c.name, tuple(sorted(set(senders) | set(receivers))), src_call=p,
                 senders=senders, receivers=receivers)]


def _hand_on(graph: Graph, plan: ExecutionPlan, p: str, t: int, have: dict[tuple[str, int], set[int]]
             ) -> list[Step]:
    """p's outputs to every consumer at once, in graph order. Why at once and not just before each
    consumer: the producer's ranks are then free for their next call, so calls on disjoint meshes
    overlap (interleaved: actor and critic training side by side); sent just before the consumer,
    the transfer would wait for every step the producer's ranks run in between."""
    out: list[Step] = []
    for k in graph.calls:
        if p in graph.parents(k.name):
            out += _transfer(plan, p, k, t, have)
    return out


def _call_steps(graph: Graph, plan: ExecutionPlan, c: Call, t: int, homes: dict[str, str],
                have: dict[tuple[str, int], set[int]], hand_on: bool = True) -> list[Step]:
    cp = plan.calls.get(c.name)
    out: list[Step] = []
    if cp is None:  # a call the partial plan lacks: no ranks, nothing moves to or from it
        have[(c.name, t)] = set()
        return [Step("call", t, c.name, (), role=c.role)]
    home = plan.calls.get(homes[c.role])
    if home is not None and homes[c.role] != c.name and home.placement != cp.placement:
        ranks = tuple(sorted(set(home.mesh.ranks) | set(cp.mesh.ranks)))
        out.append(Step("realloc", t, c.name, ranks, role=c.role))
    for p in graph.parents(c.name):  # inputs handed on earlier need no step here
        out += _transfer(plan, p, c, t, have)
    out.append(Step("call", t, c.name, tuple(sorted(cp.mesh.ranks)), role=c.role))
    have[(c.name, t)] = set()  # outputs are split over the dp holders: nobody has them whole
    return out + (_hand_on(graph, plan, c.name, t, have) if hand_on else [])


def steps(graph: Graph, plan: ExecutionPlan, start: int, stop: int, off_policy: int = 0, ahead: int = 0,
          stream_steps: int = 0) -> list[Step]:
    """The global order of steps of iterations ``start`` .. ``stop - 1`` (see the module doc).

    ``off_policy`` = k: the generation of iteration t+k comes right after iteration t's samples are
    handed on, before the rest of iteration t, so it reads the weights of k updates before those
    that train on it (staleness k, fixed by the config: the same schedule of versions on every plan).
    ``ahead`` (k > 0): how many iterations from ``start`` on had their generation run before a
    checkpoint, their outputs restored from it; their steps are left out (resume skips them).
    ``stream_steps`` = S > 0 (k > 0): streaming generation with partial rollouts (plan/stream.py):
    one generation step per version instead of one per batch, at the same places."""
    if stream_steps:
        return _streaming(graph, plan, start, stop, off_policy, ahead, stream_steps)
    if ahead and not off_policy:
        raise ValueError("ahead: only an off-policy run generates iterations ahead")
    if not 0 <= ahead <= off_policy:
        raise ValueError(f"ahead={ahead}: at most off_policy={off_policy} iterations run ahead")
    homes = home_calls(graph)
    have: dict[tuple[str, int], set[int]] = {}
    gen = _first_generations(graph)
    rest = [c for c in graph.calls if c not in gen]
    out: list[Step] = []
    for j in range(start, min(start + off_policy, stop)):  # the first k generations, before any training
        for c in gen:
            first = _call_steps(graph, plan, c, j, homes, have, hand_on=False)  # marks who holds its outputs
            out += [] if j - start < ahead else first
    for t in range(start, stop):
        if not off_policy:
            for c in gen:
                out += _call_steps(graph, plan, c, t, homes, have)
        else:
            # Hand this iteration's samples on before the same ranks generate later ones.
            for g in gen:
                out += _hand_on(graph, plan, g.name, t, have)
            if t + off_policy < stop:
                for c in gen:
                    out += _call_steps(graph, plan, c, t + off_policy, homes, have, hand_on=False)
        for c in rest:
            out += _call_steps(graph, plan, c, t, homes, have)
        out.append(Step("end", t, "", tuple(range(plan.cluster.size))))
    return out


def _streaming(graph: Graph, plan: ExecutionPlan, start: int, stop: int, k: int, ahead: int, s: int
               ) -> list[Step]:
    """``steps`` under ``train.stream_steps=s``: the prologue (the batches a checkpoint did not
    restore, under version ``start``), then per iteration t: t's samples handed on, version t's
    generation step (finish t + 1, advance the rest, admit t + k), the rest of t."""
    if not k or not 0 <= ahead <= k:
        raise ValueError(f"streaming: off_policy={k} must be >= 1 and ahead={ahead} within it")
    homes = home_calls(graph)
    have: dict[tuple[str, int], set[int]] = {}
    gen = _first_generations(graph)
    rest = [c for c in graph.calls if c not in gen]
    out: list[Step] = []

    def generation(segs: tuple[Segment, ...]) -> list[Step]:
        got: list[Step] = []
        for c in gen:
            for st in _call_steps(graph, plan, c, segs[-1].batch, homes, have, hand_on=False):
                got.append(replace(st, stream=segs) if st.kind == "call" else st)
        return got

    first = prologue(start, ahead, k, s, stop)
    if first:
        out += generation(first)
    for t in range(start, stop):
        for g in gen:
            out += _hand_on(graph, plan, g.name, t, have)
        segs = advance(t, k, s, stop)
        if segs:
            out += generation(segs)
        for c in rest:
            out += _call_steps(graph, plan, c, t, homes, have)
        out.append(Step("end", t, "", tuple(range(plan.cluster.size))))
    return out


def generated_ahead(off_policy: int, t: int, stop: int) -> list[int]:
    """The iterations whose generation ran before the end of iteration t (off-policy k: t+1 .. t+k,
    up to the last iteration); their outputs are part of t's checkpoint."""
    return list(range(t + 1, min(t + off_policy, stop - 1) + 1))


def _first_generations(graph: Graph) -> list[Call]:
    """The generation calls that need no other call's output (async runs them an iteration ahead)."""
    return [c for c in graph.calls if c.kind == "generate" and not graph.parents(c.name)]


def report_rank(plan: ExecutionPlan, call: str) -> int:
    """The rank that reports a call's statistics: the holder of dp replica 0."""
    return plan.calls[call].placement.holders()[0]
