"""A CPU decode step's attention: meshrl's ``attention.decode_attention`` (two batched matmuls
and a masked softmax) against SDPA's flash kernel, side by side in one run, on the same tensors.

    python bench/decode_attention.py [--batch 32] [--kv-heads 3] [--group 3] [--head-dim 64]
                                     [--keys 64,115,160] [--threads 2] [--calls 300] [--dtype float32]

Defaults are SmolLM2-135M's decode step (9 query heads over 3 KV heads, head_dim 64) at batch 32.
Prints microseconds a call (median of 5 rounds of ``--calls`` calls, the two alternating), the
ratio, and the largest difference between the two outputs (in bf16, each one's against the float64
attention of the same inputs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from meshrl.model.attention import decode_attention


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--group", type=int, default=3, help="query heads per KV head")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--keys", default="64,115,160", help="filled cache lengths")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, h, g, d = args.batch, args.kv_heads, args.group, args.head_dim
    for t in (int(x) for x in args.keys.split(",")):
        dt = getattr(torch, args.dtype)
        cache_k, cache_v = torch.randn(b, h, t + 32, d, dtype=dt), torch.randn(b, h, t + 32, d, dtype=dt)
        k, v = cache_k[:, :, :t], cache_v[:, :, :t]  # the filled part of a cache, as a decode step reads it
        q = torch.randn(b, h, g, d, dtype=dt)
        mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
        mask[: b // 4, ..., : t // 4] = False  # left padding of a quarter of the rows
        ours = partial(decode_attention, q, k, v, mask)
        sdpa = partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)
        if dt == torch.float32:
            diff = f"max |diff| {(ours() - sdpa()).abs().max().item():.1e}"
        else:
            exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
            diff = (f"max |error| vs float64: ours {(ours().double() - exact).abs().max().item():.1e}, "
                    f"SDPA {(sdpa().double() - exact).abs().max().item():.1e}")
        for fn in (ours, sdpa):
            per_call_us(fn, 20)
        rounds = [(per_call_us(ours, args.calls), per_call_us(sdpa, args.calls)) for _ in range(5)]
        a, s = statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)
        print(f"batch {b}, {h} KV heads x {g} queries, head_dim {d}, {t} keys, {args.dtype}, {args.threads} threads: "
              f"decode_attention {a:.0f} us, SDPA {s:.0f} us a call, SDPA/ours {s / a:.2f}x; {diff}")


if __name__ == "__main__":
    main()
