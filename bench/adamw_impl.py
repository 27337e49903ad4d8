"""ZeRO-1 AdamW's step (meshrl/parallel/data.py ZeroAdamW, dp = 1) with torch's three kernels side by
side on this machine's device: the per-tensor loop, foreach (multi-tensor) and fused, alternated
step by step on the same gradients; prints median ms per step, the ratio to the loop, and the
largest difference of the weights from the loop's after all steps.

    python bench/adamw_impl.py [--preset tiny] [--dtype float32|bfloat16] [--steps 30]

Why: it decides ZeroAdamW's default (fused on a GPU, foreach on a CPU; see the comment there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from meshrl.model.config import param_shapes  # noqa: E402
from meshrl.model.presets import get_preset  # noqa: E402
from meshrl.parallel.data import IMPLS, AdamWConfig, ZeroAdamW  # noqa: E402
from meshrl.parallel.groups import Axis  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    shapes = list(param_shapes(get_preset(args.preset)).values())
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) * 0.02 for s in shapes]
    grads = [torch.randn(s, generator=gen).to(dev, dtype) for s in shapes]
    opts = {}
    for impl in IMPLS:
        params = [nn.Parameter(t.to(dev, dtype)) for t in init]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        opts[impl] = ZeroAdamW(params, Axis((0,), 0, None), AdamWConfig(lr=1e-3, impl=impl))
    times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    for _ in range(args.steps):
        for impl, opt in opts.items():
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times[impl].append(time.perf_counter() - t)
    n = sum(t.numel() for t in init)
    print(f"{args.preset} ({n / 1e6:.1f}M parameters, {len(shapes)} tensors), {args.dtype} on {dev}, "
          f"{args.steps} steps each, alternated")
    base = statistics.median(times["loop"])
    for impl in IMPLS:
        diff = max((a.float() - b.float()).abs().max().item()
                   for a, b in zip(opts[impl].params, opts["loop"].params, strict=True))
        med = statistics.median(times[impl])
        print(f"{impl:8s} median {med * 1e3:8.2f} ms   x{med / base:.2f} of the loop   max |w - w_loop| {diff:.1e}")


if __name__ == "__main__":
    main()
