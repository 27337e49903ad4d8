"""How much faster a rank computes with more torch threads, for ``meshrl profile``.

The rest of the CPU profile times one thread (machine.py, layers.py); a rank of a run gets
``train.threads`` threads, by default the usable cores split between the machine's ranks
(meshrl/cores.py), so one rank alone on a 2-core machine runs 2. The planner scales the
one-thread layer fits by the speedup measured here for the rank's thread count
(meshrl/plan/hardware_profile.py ``from_profile``; docs/planner.md "Threads").

Per profiled width, on its DEEP-layer model (the larger of the layer pair, whose time is mostly
layers) in the dtype the layers were profiled in (a run's at ``train.dtype=auto``): forward
log-probs and forward + backward of 128 tokens, and one decoding step of 8 rows with 32 cached
tokens. Each is timed at 1 thread and at t threads alternately (``pair_medians``, so drift of the
machine's speed cancels); speedup(t) = seconds at 1 / seconds at t, for t = 2, 4, ... and the core
count.
"""

from __future__ import annotations

import torch

from ..model.decode_weights import make_caches
from ..model.generation import decode_one, sequence_logprobs
from ..model.checkpoint import build_model
from .layers import DECODE_CONTEXT, DEEP, pair_medians, width_configs

TOKENS = 128  # forward and forward + backward: one sequence of 128 tokens
DECODE_ROWS = 8  # one decoding step of 8 rows
MAX_THREADS = 64


def thread_counts(cores: int) -> tuple[int, ...]:
    """The thread counts measured besides 1: powers of two below the core count, and the count."""
    top = min(cores, MAX_THREADS)
    return tuple(sorted({t for t in (2 ** i for i in range(1, 7)) if t < top} | ({top} if top > 1 else set())))


def _kinds(cfg, dtype: torch.dtype) -> dict:
    """The three timed functions of ``cfg``'s width on a DEEP-layer model in ``dtype``."""
    model = build_model(cfg.replace(num_hidden_layers=DEEP)).to(dtype)
    ids = torch.randint(1, cfg.vocab_size, (1, TOKENS))
    mask = torch.ones(DECODE_ROWS, DECODE_CONTEXT + 1, dtype=torch.long)
    tok = torch.ones(DECODE_ROWS, dtype=torch.long)
    caches = make_caches(model, DECODE_ROWS, DECODE_CONTEXT + 1)

    def fwd() -> None:
        with torch.no_grad():
            sequence_logprobs(model, ids)

    def fwd_bwd() -> None:
        (-sequence_logprobs(model, ids).mean()).backward()
        model.zero_grad(set_to_none=True)

    def decode() -> None:
        with torch.no_grad():
            logits = decode_one(model, tok, mask, caches, DECODE_CONTEXT)
            torch.log_softmax(logits, -1).gather(-1, logits.argmax(-1, keepdim=True))

    return {"fwd": fwd, "fwd_bwd": fwd_bwd, "decode": decode}


def _at(threads: int, fn):
    def run() -> None:
        torch.set_num_threads(threads)
        fn()
    return run


def measure_thread_scaling(cores: int, quick: bool, reps: int, dtype: torch.dtype = torch.float32) -> dict:
    """{"work", "speedup": {hidden: {threads: {fwd, fwd_bwd, decode}}}} (1 thread is 1.0 by
    definition and not stored); an empty speedup where the process may use one core only."""
    counts = thread_counts(cores)
    prev = torch.get_num_threads()
    out: dict[str, dict] = {}
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            for cfg in width_configs(quick).values():
                kinds = _kinds(cfg, dtype)
                out[str(cfg.hidden_size)] = {str(t): {k: _ratio(pair_medians(_at(1, fn), _at(t, fn), reps))
                                                      for k, fn in kinds.items()} for t in counts}
    finally:
        torch.set_num_threads(prev)
    return {"work": f"{DEEP}-layer model per width: forward and forward + backward of {TOKENS} tokens, "
                    f"a decoding step of {DECODE_ROWS} rows, in {str(dtype).removeprefix('torch.')}", "speedup": out}


def _ratio(times: tuple[float, float]) -> float:
    return times[0] / times[1] if times[1] > 0 else 1.0
