"""The sampling noise of one decode step, side by side in one run: Gumbel noise for B rows of a
V-token vocabulary as ``sampling.gumbel`` computes it on a CPU (the [B, V] hash round on int32
words, in cache-sized blocks of rows) against the int64 round over the whole batch (``uniforms``,
what a GPU and torch.compile run). Both give the same bits (checked here on every shape).

    python bench/sampling_noise.py [--threads 2] [--repeats 30]

Vocabularies: the 3.2M LLaMA's (512), SmolLM2's and LLaMA-2's (49,152 / 32,000), LLaMA-3's (128,256)
and Qwen2.5 / Qwen3's (151,936). Prints milliseconds per step (medians) and int64 / int32 (> 1: the
CPU path is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from meshrl.model.sampling import gumbel, row_keys, uniforms

SHAPES = [(8, 512), (32, 512), (8, 32000), (32, 49152), (64, 49152), (32, 128256), (32, 151936)]


def int64_round(keys: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    return -torch.log(-torch.log(uniforms(keys, step, vocab)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, medians of {args.repeats}, alternating")
    print(f"{'rows':>5} {'vocab':>7} {'int64 ms':>9} {'int32 ms':>9} {'int64/int32':>12}")
    for b, v in SHAPES:
        keys, step = row_keys(list(range(b))), torch.tensor(7)
        if not torch.equal(int64_round(keys, step, v), gumbel(keys, step, v)):
            raise SystemExit(f"the two rounds differ at rows={b} vocab={v}")
        times: dict[str, list[float]] = {"int64": [], "int32": []}
        for _ in range(args.repeats):
            for name, fn in (("int64", int64_round), ("int32", gumbel)):
                t = time.perf_counter()
                fn(keys, step, v)
                times[name].append(time.perf_counter() - t)
        old, new = (statistics.median(times[k]) * 1e3 for k in ("int64", "int32"))
        print(f"{b:>5} {v:>7} {old:>9.2f} {new:>9.2f} {old / new:>11.2f}x")


if __name__ == "__main__":
    main()
