"""torch.compile against eager on this machine, for the planner's ``train.compile`` and
``gen.compile`` (meshrl/model/compiled_layers.py, meshrl/model/generation.py ``compiled``).

The runtime compiles the decoder layers, not the embedding, head or log-probs, so what the planner
needs is a layer's compiled time over its eager time. Each is measured the way meshrl/profile/layers.py
measures layers: a 1-layer and a DEEP-layer model of the same width timed alternately, the per-layer
cost their difference over DEEP - 1 layers; the compiled models run through the runtime's own
compiled functions. Three factors (compiled seconds / eager seconds per layer):

- ``fwd``: a forward without gradients (reference / critic / reward inference under train.compile;
  the planner also takes it for a generation's prefill under gen.compile, which runs the same
  compiled layer function with its KV cache);
- ``fwd_bwd``: forward + backward (training under train.compile);
- ``decode``: one decoding step of a batch (gen.compile: the step, its head and its pick are one
  graph of fixed shapes).

The one-off compile is timed too (``compile_s``: seconds of the first calls, per kind); the planner
keeps it out of the per-iteration price and reports it.
"""

from __future__ import annotations

import time

import torch

from ..model.checkpoint import build_model
from ..model.compiled_layers import compile_layers
from ..model.config import ModelConfig
from ..model.decode_weights import make_caches
from ..model.generation import compiled, decode_and_pick, decode_one, sequence_logprobs
from ..model.presets import get_preset
from .layers import DEEP, _layer_pair

DECODE_CONTEXT = 32  # cached tokens behind the decoding step measured (as profile/layers.py)
DECODE_SLOTS = 64  # the compiled step's cache: the context rounded up to generation's bucket
REPS_SCALE = 3


def _pair(cfg: ModelConfig, compile_them: bool, dtype: torch.dtype) -> tuple:
    models = tuple(build_model(cfg.replace(num_hidden_layers=n)).to(dtype) for n in (1, DEEP))
    if compile_them:
        for m in models:
            compile_layers(m.model.layers)
    return models


def _forward_fns(models: tuple, ids: torch.Tensor) -> dict[str, tuple]:
    def fwd(model) -> None:
        with torch.no_grad():
            sequence_logprobs(model, ids)

    def fwd_bwd(model) -> None:
        (-sequence_logprobs(model, ids).mean()).backward()
        model.zero_grad(set_to_none=True)

    return {k: (lambda f=f: f(models[0]), lambda f=f: f(models[1])) for k, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd))}


def _decode_fns(models: tuple, batch: int, compiled_step: bool) -> tuple:
    """One greedy decoding step of ``batch`` rows as generation runs it: eager, an int slot and the
    filled prefix's mask; compiled, the whole cache's mask and a tensor slot (fixed shapes)."""
    tok = torch.ones(batch, dtype=torch.long)
    slots = DECODE_SLOTS if compiled_step else DECODE_CONTEXT + 1
    mask = torch.ones(batch, slots, dtype=torch.long)
    caches = [make_caches(m, batch, slots, pack=not compiled_step) for m in models]
    slot, step = torch.tensor(DECODE_CONTEXT), torch.tensor(0)
    steps = [compiled("decode_and_pick", decode_and_pick, m) for m in models] if compiled_step else None

    def one(i: int) -> None:
        with torch.inference_mode():
            if steps is not None:
                steps[i](models[i], tok, mask, caches[i], slot, None, step, 1.0, 0, 1.0)
            else:
                logits = decode_one(models[i], tok, mask, caches[i], DECODE_CONTEXT)
                torch.log_softmax(logits, -1).gather(-1, logits.argmax(-1, keepdim=True))

    return (lambda: one(0)), (lambda: one(1))


def _per_layer(f1, f2, reps: int) -> float:
    t1, t2 = _layer_pair(f1, f2, reps)
    return max(t2 - t1, 1e-9) / (DEEP - 1)


def _first_calls(fns: tuple) -> float:
    """Seconds of the first call of each function (the compiles they trigger)."""
    t = time.perf_counter()
    for fn in fns:
        fn()
    return time.perf_counter() - t


def measure_compile(reps: int, cfg: ModelConfig | None = None, batch: int = 4, seq: int = 128,
                    decode_batch: int = 32, dtype: torch.dtype = torch.float32) -> dict:
    """{"hidden", "dtype", "fwd", "fwd_bwd", "decode": compiled / eager seconds per layer, "compile_s":
    {kind: seconds}} for ``cfg``'s width (default: the tiny preset) in ``dtype`` (the profile's: a run's
    at train.dtype=auto), on the threads torch has now.

    Each factor is a ratio of two differences of timings, which magnifies their noise, so it takes
    REPS_SCALE x ``reps`` repetitions per timing (the calls take milliseconds), and the sizes are
    the largest that keep it quick; ``python bench/compile_factors.py --repeat 3`` shows the spread
    of the factors on a machine."""
    cfg, reps = cfg or get_preset("tiny"), REPS_SCALE * reps
    out: dict = {"hidden": cfg.hidden_size, "dtype": str(dtype).removeprefix("torch."), "compile_s": {}}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        eager, comp = _pair(cfg, False, dtype), _pair(cfg, True, dtype)
        ids = torch.randint(1, cfg.vocab_size, (batch, seq))
        fe, fc = _forward_fns(eager, ids), _forward_fns(comp, ids)
        for kind in ("fwd", "fwd_bwd"):
            out["compile_s"][kind] = _first_calls(fc[kind])
            out[kind] = _per_layer(*fc[kind], reps) / _per_layer(*fe[kind], reps)
        de, dc = _decode_fns(eager, decode_batch, False), _decode_fns(comp, decode_batch, True)
        out["compile_s"]["decode"] = _first_calls(dc)
        out["decode"] = _per_layer(*dc, reps) / _per_layer(*de, reps)
    return out
