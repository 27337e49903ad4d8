"""Per-layer timings of meshrl's own decoder layer on this machine (ReaL's estimator profiles the
same thing: one transformer block per shape, then interpolates).

On a CPU a small model is dominated by fixed per-call costs that FLOP counts miss, so the CPU
profile times meshrl's real model code (1- and 2-layer models of each width): forward log-probs,
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
from ..model.generation import decode_one, make_caches, sequence_logprobs

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


def _median(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _fit(points: list[tuple[float, float]]) -> dict[str, float]:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
    if slope <= 0:
        x_max, y_max = max(points)
        slope = y_max / x_max
    return {"latency_s": max(my - mx * slope, 0.0), "sec_per_unit": slope}


def _model_times(model, cfg: ModelConfig, tokens: tuple[int, ...], batches: tuple[int, ...], reps: int
                 ) -> dict[str, list[tuple[float, float]]]:
    """(size, seconds) of a whole model's forward log-probs, forward + backward, and one greedy
    decoding step (decode_one, log-softmax, argmax: what generate does per token)."""
    out: dict[str, list[tuple[float, float]]] = {"fwd": [], "fwd_bwd": [], "decode": []}
    for t in tokens:
        s = min(t, 128)
        b = max(1, t // s)
        ids = torch.randint(1, cfg.vocab_size, (b, s))
        with torch.no_grad():
            out["fwd"].append((b * s, _median(lambda ids=ids: sequence_logprobs(model, ids), reps)))

        def step(ids=ids) -> None:
            (-sequence_logprobs(model, ids).mean()).backward()
            model.zero_grad(set_to_none=True)

        out["fwd_bwd"].append((b * s, _median(step, reps)))
    for b in batches:
        caches = make_caches(model, b, DECODE_CONTEXT + 1)
        mask = torch.ones(b, DECODE_CONTEXT + 1, dtype=torch.long)
        tok = torch.ones(b, dtype=torch.long)

        def one(tok=tok, mask=mask, caches=caches) -> None:
            logits = decode_one(model, tok, mask, caches, DECODE_CONTEXT)
            torch.log_softmax(logits, -1).gather(-1, logits.argmax(-1, keepdim=True))

        with torch.no_grad():
            out["decode"].append((b, _median(one, reps)))
    return out


def measure_layer(cfg: ModelConfig, tokens: tuple[int, ...], batches: tuple[int, ...], reps: int) -> dict:
    """Per-layer and fixed (embedding, head, log-probs, masks, sampling) costs of ``cfg``'s width,
    from the same measurements on a 1-layer and a 2-layer model: layer = t2 - t1, fixed = 2 t1 - t2."""
    one = _model_times(build_model(cfg.replace(num_hidden_layers=1)), cfg, tokens, batches, reps)
    two = _model_times(build_model(cfg.replace(num_hidden_layers=2)), cfg, tokens, batches, reps)
    res: dict = {"layer_params": sum(_numel(s) for k, s in param_shapes(cfg).items()
                                     if k.startswith("model.layers.0.")),
                 "head_params": cfg.vocab_size * cfg.hidden_size}
    for kind in one:
        pairs = list(zip(one[kind], two[kind], strict=True))
        res[kind] = _fit([(x, max(t2 - t1, 1e-9)) for (x, t1), (_, t2) in pairs])
        res["fixed_" + kind] = _fit([(x, max(2 * t1 - t2, 1e-9)) for (x, t1), (_, t2) in pairs])
    return res


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def measure_layers(quick: bool, reps: int) -> dict[str, dict]:
    """{hidden size: fits} for every profiled width, measured on one thread."""
    tokens = (16, 128) if quick else (16, 128, 512)
    batches = (1, 16) if quick else (1, 8, 64)
    out = {}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for cfg in width_configs(quick).values():
            out[str(cfg.hidden_size)] = measure_layer(cfg, tokens, batches, reps)
    return out
