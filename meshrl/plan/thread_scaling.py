"""A CPU profile's one-thread figures, scaled to the torch threads a rank of the run gets.

``meshrl profile`` times compute on one thread and measures separately how much faster a rank
computes with t threads (meshrl/profile/threads.py: per width, forward, forward + backward
and a decoding step, t = 2, 4, ... and the core count). A rank gets ``train.threads`` threads, by
default the usable cores split between the machine's ranks (meshrl/cores.py), so one rank alone on
a 2-core machine runs 2 and each of two ranks runs 1. Here:

- every layer fit of a width (per-layer and fixed parts, latency and per-unit terms) is divided by
  that width's measured speedup of its kind (forward, forward + backward, decoding), interpolated
  linearly between measured thread counts and flat beyond the largest (more threads than cores
  gain nothing); the matmul FLOP/s are multiplied by the forward + backward speedup of the nearest
  width. The optimizer's per-tensor time and the copy bandwidth stay as measured (Python per
  tensor, and one memory bus): an approximation, named in docs/planner.md;
- the shared-cores curve, measured with one-thread ranks, becomes one for t-thread ranks: k busy
  ranks run k x t threads, and a t-thread rank's speedup already counts its own t, so
  slowdown_t(k) = slowdown(k x t) / slowdown(t).

Pure Python, as all of meshrl/plan.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from .hardware import Hardware, LayerFits, LinkFit

KINDS = {"fwd": "fwd", "fwd_bwd": "fwd_bwd", "decode": "decode",
         "fixed_fwd": "fwd", "fixed_fwd_bwd": "fwd_bwd", "fixed_decode": "decode"}


def speedup(curve: dict[str, dict[str, float]], threads: int, kind: str) -> float:
    """Speedup of ``threads`` threads over one, for ``kind``, from one width's {t: {kind: s}}."""
    pts = [(1, 1.0)] + sorted((int(t), float(v[kind])) for t, v in curve.items())
    ts = [t for t, _ in pts]
    i = bisect.bisect_left(ts, threads)
    if i == len(pts):
        return pts[-1][1]
    if ts[i] == threads:
        return pts[i][1]
    (t0, s0), (t1, s1) = pts[i - 1], pts[i]
    return s0 + (s1 - s0) * (threads - t0) / (t1 - t0)


def _scaled(fit: LinkFit, s: float) -> LinkFit:
    return LinkFit(fit.latency / s, fit.sec_per_byte / s)


def _nearest(curves: dict[str, dict], hidden: int) -> dict:
    return curves[min(curves, key=lambda h: abs(int(h) - hidden))]


def for_threads(hw: Hardware, scaling: dict | None, threads: int) -> Hardware:
    """``hw`` (read from a profile, one thread per rank) as it runs with ``threads`` per rank;
    unchanged for one thread, or where the profile has no speedup measured (an older profile, or a
    one-core machine: hardware.profile_mismatches warns when that matters)."""
    curves = (scaling or {}).get("speedup") or {}
    if threads <= 1 or not curves or not hw.layers:
        return replace(hw, threads=max(threads, 1))
    layers = tuple((h, LayerFits(f.layer_params, f.head_params,
                                 *(_scaled(getattr(f, k), speedup(_nearest(curves, h), threads, kind))
                                   for k, kind in KINDS.items())))
                   for h, f in hw.layers)
    matmul = tuple((h, f * speedup(_nearest(curves, h), threads, "fwd_bwd")) for h, f in hw.matmul)
    contention = hw.contention
    if contention:
        base = hw.slowdown(threads)
        contention = tuple((k, hw.slowdown(k * threads) / base) for k, _ in contention)
    return replace(hw, layers=layers, matmul=matmul, peak_flops=max(f for _, f in matmul) if matmul else hw.peak_flops,
                   contention=contention, threads=threads)
