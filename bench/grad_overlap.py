"""The dp gradient all-reduce overlapped with the backward (meshrl/parallel/overlap.py) against the
same reduction after the backward (parallel/data.py all_reduce_grads), side by side in one run:
forward + backward + reduction of one dp2 step on 2 gloo ranks (or NCCL GPUs), the two modes
alternated step by step; prints the medians and their ratio.

    python bench/grad_overlap.py [--preset tiny] [--batch 16] [--seq 64] [--micro 1] [--bucket-mb 1] [--reps 7]

On a CPU the all-reduce runs on gloo's threads while the backward computes, so the gain is what the
cores left over allow (on a loaded 2-core machine: little); on GPUs NCCL runs on its own stream.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from meshrl.runtime.launch import RankPool  # noqa: E402

_state: dict = {}


def _setup(preset: str, batch: int, seq: int, bucket_mb: float) -> bool:
    from meshrl.layout.mesh import Placement
    from meshrl.model.presets import get_preset
    from meshrl.parallel.data import AdamWConfig
    from meshrl.parallel.groups import GroupCache
    from meshrl.parallel.load import InitLoader
    from meshrl.parallel.model import ParallelModel

    cfg = get_preset(preset)
    cache = GroupCache()
    for overlap in (False, True):
        _state[overlap] = ParallelModel.create(cfg, Placement.parse("dp2tp1pp1@0-1"), cache, InitLoader(cfg, 0),
                                               optim=AdamWConfig(lr=1e-5), grad_bucket_bytes=int(bucket_mb * 2**20),
                                               overlap_grad_reduce=overlap)
    gen = torch.Generator().manual_seed(dist.get_rank())
    ids = torch.randint(1, cfg.vocab_size - 8, (batch // 2, seq), generator=gen)
    _state["batch"] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    n_tokens = float(batch * (seq - 1))
    _state["loss"] = lambda out, mb: -out.logprobs.sum() / n_tokens
    return True


def _step(overlap: bool, micro: int) -> float:
    model = _state[overlap]
    dist.barrier()
    t0 = time.perf_counter()
    model.forward_backward(_state["batch"], _state["loss"], micro)
    dt = time.perf_counter() - t0
    model.optimizer.zero_grad()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (split over dp2)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    with RankPool(2, timeout=300) as pool:
        pool.run(_setup, args.preset, args.batch, args.seq, args.bucket_mb)
        for r in range(args.reps + 1):
            for overlap in (False, True):
                t = max(pool.run(_step, overlap, args.micro))  # the slower rank ends the step
                if r:  # the first round warms up
                    times[overlap].append(t)
    after, over = statistics.median(times[False]), statistics.median(times[True])
    print(f"{args.preset}, dp2 on 2 ranks, {args.batch} x {args.seq} tokens, {args.micro} micro-batch(es), "
          f"{args.bucket_mb} MiB buckets, medians of {args.reps} alternated steps")
    print(f"reduction after the backward  {after * 1e3:8.1f} ms")
    print(f"overlapped with the backward  {over * 1e3:8.1f} ms   x{over / after:.2f}")


if __name__ == "__main__":
    main()
