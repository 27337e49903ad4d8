"""The cost of one pipeline hop in generation, for ``meshrl profile``.

A decoding step through pp stages pays, per stage boundary, more than its compute and the bytes
of the hidden state: the next stage's process is woken by the message, runs its own per-call code
(masks, positions), and the last stage's tokens come back by a broadcast. These per-hop costs are
latencies of the machine's processes and gloo, not FLOPs, so they are measured: 2 ranks of a
``RankPool`` generate with meshrl's own tiny model at pp = 2, and rank 0 alone at pp = 1 (the same
prompts, greedy), 2 and 16 new tokens each, timed alternately; the hop is the extra seconds per
decoding step of pp = 2 over pp = 1 ((t16 - t2) / 14 of each, so the prefill cancels), the median
of the two batch sizes measured. pp = 2 runs the whole batch as one micro-batch, the stages in
turn, so that the difference is the hops and not the overlap of micro-batches. On a CPU the hop
comes out well above what the p2p ping-pong of the collectives' fit gives (docs/planner.md, the
profile's ``pipeline``).
"""

from __future__ import annotations

import statistics
import time

import torch.distributed as dist

from ..runtime.launch import RankPool
from ..model.checkpoint import build_model
from ..parallel.groups import GroupCache
from ..layout.mesh import Placement
from ..parallel.model import ParallelModel
from ..model.generation import GenerationConfig
from ..parallel.generate import pipelined_generate

PROMPT, SHORT, LONG = 16, 2, 16  # prompt tokens; the two generation lengths timed
BATCHES = (8, 32)
_state: dict = {}


def _setup() -> bool:
    plain = build_model("tiny", seed=0)
    cache = GroupCache()
    _state["pp2"] = ParallelModel.from_state(plain.config, Placement.parse("dp1tp1pp2@0-1"), cache,
                                             plain.state_dict())
    alone = Placement.parse("dp1tp1pp1@0")
    _state["pp1"] = ParallelModel.from_state(plain.config, alone, cache, plain.state_dict() if dist.get_rank() == 0
                                             else None)
    _state["pad"] = plain.config.pad_token_id
    return True


def _generate(which: str, batch: int, tokens: int, reps: int) -> float | None:
    """Median seconds of ``reps`` greedy generations (after one warm-up); None off the mesh."""

    model = _state[which]
    if model is None:
        return None
    prompts = [[(7 * i + j) % 200 + 1 for j in range(PROMPT)] for i in range(batch)]
    cfg = GenerationConfig(max_new_tokens=tokens, greedy=True, eos_token_id=None, pad_token_id=_state["pad"])
    times = []
    for r in range(reps + 1):
        if which == "pp2":
            dist.barrier()
        t = time.perf_counter()
        pipelined_generate(model.stage, model.pipe, model.groups.tp, prompts, cfg, micro_batches=1)
        if r:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_pipeline_hop(reps: int, timeout_s: float = 120.0) -> dict:
    """{"hop_s": seconds per decoding step per stage boundary, "per_batch": {b: seconds}}."""
    per: dict[str, float] = {}
    with RankPool(2, backend="gloo", timeout=timeout_s, start_timeout=timeout_s,
                  env={"OMP_NUM_THREADS": "1"}) as pool:  # one-thread ranks, as the rest of the profile
        pool.run(_setup)
        for b in BATCHES:
            step = {}
            for which in ("pp1", "pp2", "pp1", "pp2"):  # alternated: drift hits both alike
                t = {n: pool.run(_generate, which, b, n, reps)[0] for n in (SHORT, LONG)}
                step.setdefault(which, []).append((t[LONG] - t[SHORT]) / (LONG - SHORT))
            per[str(b)] = max(statistics.mean(step["pp2"]) - statistics.mean(step["pp1"]), 0.0)
    return {"hop_s": statistics.median(per.values()), "per_batch": per,
            "work": f"tiny model, greedy, {PROMPT}-token prompts, pp 2 vs pp 1, {SHORT} and {LONG} new tokens"}
