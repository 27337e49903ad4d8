"""The pick of one decode step on a CPU, side by side in one run, for B rows of a V-token vocabulary:

- the Gumbel noise as ``sampling.gumbel`` computes it (the [B, V] hash round on int32 words, in
  cache-sized blocks of rows) against the int64 round over the whole batch (``gumbel_int64``, what a
  GPU and torch.compile run);
- the token, ``sampling.first_argmax`` (block maxima, then the first index in the first block that
  holds the row's maximum) against ``torch.argmax``.

Each pair gives the same bits / indices (checked here on every shape).

    python bench/sampling_noise.py [--threads 2] [--repeats 30]

Vocabularies: the 3.2M LLaMA's (512), SmolLM2's and LLaMA-2's (49,152 / 32,000), LLaMA-3's (128,256)
and Qwen2.5 / Qwen3's (151,936). Prints milliseconds per step (medians) and old / new (> 1: meshrl's
CPU path is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from meshrl.model.sampling import first_argmax, gumbel, gumbel_int64, row_keys

SHAPES = [(8, 512), (32, 512), (8, 32000), (32, 49152), (64, 49152), (32, 128256), (32, 151936)]


def timed(pairs: tuple, args: tuple, repeats: int) -> tuple[float, float]:
    """Median milliseconds of the two functions of ``pairs``, called alternately on ``args``."""
    times: list[list[float]] = [[], []]
    for _ in range(repeats):
        for i, fn in enumerate(pairs):
            t = time.perf_counter()
            fn(*args)
            times[i].append(time.perf_counter() - t)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, medians of {args.repeats}, alternating")
    print(f"{'rows':>5} {'vocab':>7} {'noise int64':>12} {'int32':>7} {'ratio':>6}   {'torch.argmax':>12} "
          f"{'first_argmax':>12} {'ratio':>6}   (ms)")
    for b, v in SHAPES:
        keys, step = row_keys(list(range(b))), torch.tensor(7)
        if not torch.equal(gumbel_int64(keys, step, v), gumbel(keys, step, v)):
            raise SystemExit(f"the two noise rounds differ at rows={b} vocab={v}")
        scores = torch.randn(b, v) + gumbel(keys, step, v)
        if not torch.equal(scores.argmax(-1), first_argmax(scores)):
            raise SystemExit(f"the two argmaxes differ at rows={b} vocab={v}")
        n_old, n_new = timed((gumbel_int64, gumbel), (keys, step, v), args.repeats)
        a_old, a_new = timed((lambda x: x.argmax(-1), first_argmax), (scores,), args.repeats)
        print(f"{b:>5} {v:>7} {n_old:>12.2f} {n_new:>7.2f} {n_old / n_new:>5.2f}x   {a_old:>12.2f} "
              f"{a_new:>12.2f} {a_old / a_new:>5.2f}x")


if __name__ == "__main__":
    main()
