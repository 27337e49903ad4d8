"""A CPU's attention over whole sequences (training, reference / critic inference, a prefill):
meshrl's ``attention.short_attention`` (two matmuls and a softmax over the materialised scores)
against SDPA's flash kernel, side by side in one run, forward and forward + backward, at each
sequence length: where the crossover lies that ``cpu_features.SHORT_ATTENTION_KEYS`` encodes.

    python bench/short_attention.py [--shape llama-3m|smollm2] [--tokens 1184] [--lengths 32,64,96,128,192,256]
                                    [--dtype float32,bfloat16] [--threads 2] [--calls 20]

``--shape``: the heads of bench_models.LLAMA_3M (8 query heads over 4 KV heads, head_dim 32) or of
SmolLM2-135M (9 over 3, head_dim 64). The batch is ``--tokens`` / length rows (causal, no padding).
SDPA runs as the model runs it: in bf16 on float32 copies of q, k and v (its bf16 backward is the
slower, model/transformer.py). Prints milliseconds a call (median of 5 rounds, the two
alternating) and SDPA / ours (> 1: ours is faster), and the largest difference of the outputs from
the float64 attention of the same inputs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from meshrl.model.attention import short_attention

SHAPES = {"llama-3m": (8, 4, 32), "smollm2": (9, 3, 64)}


def per_call_ms(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def sdpa(q, k, v):
    wide = q.dtype in (torch.float32, torch.float64)
    a, b, c = (q, k, v) if wide else (q.float(), k.float(), v.float())
    return F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True).to(q.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama-3m", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=1184, help="tokens a call (rows x length)")
    ap.add_argument("--lengths", default="32,64,96,128,192,256")
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hq, hkv, d = SHAPES[args.shape]
    for dt in (getattr(torch, n) for n in args.dtype.split(",")):
        for s in (int(x) for x in args.lengths.split(",")):
            b = max(1, args.tokens // s)
            q, k, v = (torch.randn(b, h, s, d, dtype=dt, requires_grad=True) for h in (hq, hkv, hkv))
            grad = torch.randn(b, hq, s, d, dtype=dt)
            exact = sdpa(q.detach().double(), k.detach().double(), v.detach().double())
            errs = [(f(q, k, v).detach().double() - exact).abs().max().item()
                    for f in (lambda *t: short_attention(*t, None, True), sdpa)]
            row = [f"{args.shape} heads, {b} x {s} tokens, {str(dt)[6:]}:"]
            for name, bwd in (("forward", False), ("forward+backward", True)):
                def run(f, bwd=bwd, qkv=(q, k, v), grad=grad):
                    out = f(*qkv)
                    if bwd:
                        out.backward(grad)
                ours, flash = (lambda: run(lambda *t: short_attention(*t, None, True))), (lambda: run(sdpa))
                with torch.set_grad_enabled(bwd):
                    for fn in (ours, flash):
                        per_call_ms(fn, 2)
                    rounds = [(per_call_ms(ours, args.calls), per_call_ms(flash, args.calls)) for _ in range(5)]
                o, f = statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)
                row.append(f"{name} ours {o:.2f} ms, SDPA {f:.2f} ms, {f / o:.2f}x;")
            row.append(f"max |error| vs float64: ours {errs[0]:.1e}, SDPA {errs[1]:.1e}")
            print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
