"""One generation step of streaming generation with partial rollouts (``train.stream_steps``): the
segments the step order gives it (meshrl/plan/stream.py), run on this rank's generation replica.

The rows in flight of batch j live in ``engine.held[(call, j)]`` on *every* rank of the replica
(each rank of a tp/pp replica runs the same generation and gets the same outputs), as the finished
outputs of a whole-batch generation do on the replica's holder; the transfer that hands batch j on
reads the holder's, and a checkpoint saves them all (runtime/ahead.py), so the rows in flight, their
tokens, log-probs and versions resume exactly, also under another plan.
"""

from __future__ import annotations

from ..algo.batch import Batch
from ..algo.common import CallContext
from ..algo.partial import continue_rows
from ..algo.registry import SEQ_KEYS, tensor_keys
from ..plan.steps import Step
from ..plan.stream import token_budget


def run(engine, step: Step) -> None:
    """The step's segments, oldest batch first, under the weights of their version (all segments of
    a step share one version: the weights between two updates)."""
    call = engine.graph.call(step.call)
    pl = engine.plan.calls[call.name].placement
    role = engine.roles[call.role]
    version = step.stream[0].version
    h, sync_s, sync_bytes = role.rollout(pl, version)
    engine._weight_sync(step.iteration, sync_s, sync_bytes)
    dp_i = pl.coords_of(engine.rank)[0]
    micro = engine.plan.calls[call.name].micro_batches
    greedy = call.name.endswith("_greedy")  # ReMax's greedy baseline: the same stream, argmax
    n = engine.cfg.data.gen_len
    for seg in step.stream:
        part = engine._batch(seg.batch).only(tensor_keys(call.inputs)).split(pl.layout.dp)[dp_i]
        key = (call.name, seg.batch)
        state = engine.held.get(key)
        ctx = CallContext(engine.cfg, seg.batch, engine.tok)
        out = continue_rows(h, part, state, ctx, min(micro, len(part)), seg.first, token_budget(seg, n),
                            seg.version, at_bound=seg.steps is None and seg.first > 0, greedy=greedy)
        if greedy and seg.steps is None:  # finished: the keys its consumers read
            out = Batch({f"{k}_greedy": v for k, v in out.only(list(SEQ_KEYS)).data.items()}, out.index)
        engine.held[key] = out

