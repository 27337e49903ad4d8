"""Per-layer timings of meshrl's own decoder layer on this machine (ReaL's estimator profiles the
same thing: one transformer block per shape, then interpolates).

On a CPU a small model is dominated by fixed per-call costs that FLOP counts miss, so the CPU
profile times meshrl's real model code (1- and DEEP-layer models of each width): forward log-probs,
forward + backward, and one decoding step, split into a per-layer part and a fixed part (embedding,
head, log-probs, masks, sampling), each fitted as ``latency + size x seconds_per_unit`` (unit: a
token, or a sequence for decoding).
"""

from __future__ import annotations

import statistics
import time

import torch

from ..model.config import ModelConfig, param_shapes
from ..model.presets import get_preset
from ..model.checkpoint import build_model
from ..model.decode_weights import make_caches
from ..model.generation import decode_one, sequence_logprobs
from ..parallel.data import AdamWConfig, ZeroAdamW, clip_grad_norm
from ..plan.estimator import ADAM_STEP_BYTES
from ..parallel.groups import Axis

DECODE_CONTEXT = 32  # cached tokens behind each decoding step measured


def width_configs(quick: bool) -> dict[str, ModelConfig]:
    """The widths profiled: tiny (quick run), small, and a 2048-wide LLaMA-style layer."""
    cfgs = {"tiny": get_preset("tiny")}
    if not quick:
        cfgs["small"] = get_preset("small")
        # A small vocabulary keeps its head cheap to time; head costs scale by parameter count.
        cfgs["w2048"] = ModelConfig(vocab_size=4096, hidden_size=2048, intermediate_size=5504,
                                    num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=4)
    return cfgs


def median_time(fn, reps: int) -> float:
    """Median seconds of ``reps`` calls of ``fn`` after one warm-up call (every timing of the
    profile and of bench/estimator_accuracy.py goes through this or ``pair_medians``)."""
    return pair_medians(fn, None, reps)[0]


def pair_medians(f1, f2, reps: int) -> tuple[float, float]:
    """Median seconds of f1 and of f2 (None: f1 alone), timed alternately. Why alternately: the
    per-layer cost is a difference of the two, and a CPU whose speed drifts between two blocks of
    timings (turbo, other tenants) would put the drift into that difference (a drift seen here made
    it negative)."""
    fns = (f1,) if f2 is None else (f1, f2)
    for fn in fns:
        fn()
    acc: tuple[list[float], ...] = tuple([] for _ in fns)
    for _ in range(reps):
        for fn, times in zip(fns, acc, strict=True):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    meds = [statistics.median(times) for times in acc]
    return meds[0], meds[-1]


def linear_fit(points: list[tuple[float, float]], slope_key: str = "sec_per_unit") -> dict[str, float]:
    """Least-squares ``y = latency_s + x * slope`` through (x, y) points, as {latency_s, slope_key};
    if noise makes the slope non-positive, the largest point's average rate is used."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
    if slope <= 0:
        x_max, y_max = max(points)
        slope = y_max / x_max
    return {"latency_s": max(my - mx * slope, 0.0), slope_key: slope}


# The deeper model of each pair. Why 4 and not 2: the per-layer cost is a difference of two noisy
# timings; over 3 layers instead of 1 the same timing noise moves it a third as much (with 2 layers,
# repeated profiles of the same code scatter by +-25%: docs/planner.md "Estimator accuracy on 2 and
# 4 ranks").
DEEP = 4


def _layer_pair(f1, f2, reps: int, retries: int = 2, deep: int = DEEP) -> tuple[float, float]:
    """``pair_medians`` of a 1-layer (f1) and a ``deep``-layer (f2) model. The per-layer cost
    (t2 - t1) / (deep - 1) and the fixed cost t1 - that (embedding, head, log-probs) are both
    positive; a pair that makes either <= 0 is noise (other processes sharing the cores), so it is
    timed again, up to ``retries`` times, each as long as the first (more repetitions per timing
    would lengthen every profile, not only the noisy ones); the last timing stands."""
    t1, t2 = pair_medians(f1, f2, reps)
    for _ in range(retries):
        if t1 < t2 < deep * t1:
            break
        t1, t2 = pair_medians(f1, f2, reps)
    return t1, t2


def _model_times(models: tuple, cfg: ModelConfig, tokens: tuple[int, ...], batches: tuple[int, ...], reps: int
                 ) -> dict[str, list[tuple[float, float, float]]]:
    """(size, seconds of models[0], seconds of models[1]) of forward log-probs, forward + backward,
    and one greedy decoding step (decode_one, log-softmax, argmax: what generate does per token)."""
    out: dict[str, list[tuple[float, float, float]]] = {"fwd": [], "fwd_bwd": [], "decode": []}
    for t in tokens:
        s = min(t, 128)
        b = max(1, t // s)
        ids = torch.randint(1, cfg.vocab_size, (b, s))

        def fwd(model, ids=ids) -> None:
            with torch.no_grad():
                sequence_logprobs(model, ids)

        def step(model, ids=ids) -> None:
            (-sequence_logprobs(model, ids).mean()).backward()
            model.zero_grad(set_to_none=True)

        for kind, fn in (("fwd", fwd), ("fwd_bwd", step)):
            out[kind].append((b * s, *_layer_pair(lambda fn=fn: fn(models[0]), lambda fn=fn: fn(models[1]), reps)))
    for b in batches:
        mask = torch.ones(b, DECODE_CONTEXT + 1, dtype=torch.long)
        tok = torch.ones(b, dtype=torch.long)
        caches = [make_caches(m, b, DECODE_CONTEXT + 1) for m in models]

        def one(i: int, tok=tok, mask=mask, caches=caches) -> None:
            with torch.no_grad():
                logits = decode_one(models[i], tok, mask, caches[i], DECODE_CONTEXT)
                torch.log_softmax(logits, -1).gather(-1, logits.argmax(-1, keepdim=True))

        out["decode"].append((b, *_layer_pair(lambda: one(0), lambda: one(1), reps)))
    return out


def measure_layer(cfg: ModelConfig, tokens: tuple[int, ...], batches: tuple[int, ...], reps: int,
                  dtype: torch.dtype = torch.float32) -> dict:
    """Per-layer and fixed (embedding, head, log-probs, masks, sampling) costs of ``cfg``'s width,
    from the same measurements on a 1-layer and a DEEP-layer model: layer = (tD - t1) / (DEEP - 1),
    fixed = t1 - layer. The models' weights are in ``dtype``."""
    models = (build_model(cfg.replace(num_hidden_layers=1)).to(dtype),
              build_model(cfg.replace(num_hidden_layers=DEEP)).to(dtype))
    times = _model_times(models, cfg, tokens, batches, reps)
    res: dict = {"layer_params": sum(_numel(s) for k, s in param_shapes(cfg).items()
                                     if k.startswith("model.layers.0.")),
                 "head_params": cfg.vocab_size * cfg.hidden_size}
    for kind, pts in times.items():
        layer = [(x, t1, (t2 - t1) / (DEEP - 1)) for x, t1, t2 in pts]
        res[kind] = linear_fit([(x, max(per, 1e-9)) for x, _, per in layer])
        res["fixed_" + kind] = linear_fit([(x, max(t1 - per, 1e-9)) for x, t1, per in layer])
    return res


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def measure_layers(quick: bool, reps: int, dtype: torch.dtype = torch.float32) -> dict[str, dict]:
    """{hidden size: fits} for every profiled width, measured on one thread in ``dtype``."""
    tokens = (16, 128) if quick else (16, 128, 512)
    batches = (1, 16) if quick else (1, 8, 64)
    out = {}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for cfg in width_configs(quick).values():
            out[str(cfg.hidden_size)] = measure_layer(cfg, tokens, batches, reps, dtype)
    return out


def measure_optimizer(reps: int, mem_bw: float) -> dict:
    """One optimizer step of the tiny model as the runtime takes it on one rank (the whole-model
    gradient clip, ZeRO-1 AdamW with its default kernel, clearing the gradients): on a CPU its cost
    is mostly per tensor (small kernels and Python each), not bytes. -> {step_s, tensors, params,
    sec_per_tensor}: what the step takes beyond its bytes (ADAM_STEP_BYTES per parameter at
    ``mem_bw``, the estimator's bandwidth term), per parameter tensor."""

    model = build_model(get_preset("tiny"))
    named = dict(model.named_parameters())
    alone = Axis((0,), 0, None)
    opt = ZeroAdamW(list(named.values()), alone, AdamWConfig(), list(named))
    grads = {n: torch.randn_like(p) * 1e-3 for n, p in named.items()}

    def step() -> None:
        for n, p in named.items():
            p.grad = grads[n].clone()
        clip_grad_norm(named, set(named), alone, 1.0)
        opt.step()
        opt.zero_grad()

    def grads_only() -> None:  # what setting the gradients up costs, taken off the step's time
        for n, p in named.items():
            p.grad = grads[n].clone()
        opt.zero_grad()

    t_step, t_grads = pair_medians(step, grads_only, reps)
    step_s, params = t_step - t_grads, sum(p.numel() for p in named.values())
    return {"step_s": step_s, "tensors": len(named), "params": params,
            "sec_per_tensor": max(step_s - ADAM_STEP_BYTES * params / mem_bw, 0.0) / len(named)}
