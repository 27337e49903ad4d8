"""Rank-side work of ``meshrl bench realloc`` (and of the executor tests): move a model between two
placements with synthetic weights, check every element, and measure point-to-point bandwidth.

Functions here run on every rank of a RankPool (module level, so they pickle by reference).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from ..model.config import ModelConfig
from ..parallel.mesh import Placement
from .executor import DEFAULT_BUCKET_BYTES, Reallocator
from .plan import realloc_plan
from .shardmap import shard_map
from .synthetic import synthetic, synthetic_shards

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sync(timeout: float = 300.0) -> None:
    """A barrier with a deadline (dist.barrier has none on gloo)."""
    work = dist.all_reduce(torch.zeros(1, device=_device()), async_op=True)
    work.wait(timeout=datetime.timedelta(seconds=timeout))


def move_and_check(cfg: ModelConfig, src: str, dst: str, value_head: bool = False, seed: int = 0,
                   dtype: str = "fp32", bucket_bytes: int = DEFAULT_BUCKET_BYTES, repeat: int = 1,
                   timeout: float = 300.0) -> dict:
    """Move synthetic weights from placement ``src`` to ``dst`` (e.g. 'dp2tp2pp1@0-3') on this rank.

    Returns {"exact", "sent", "received", "copied", "seconds", "rounds", "peak_buffer_bytes"}; seconds
    is the best of ``repeat`` runs, each timed from a common barrier to a common barrier."""
    rank, tdt = dist.get_rank(), DTYPES[dtype]
    device = _device()
    itemsize = torch.empty((), dtype=tdt).element_size()
    plan = realloc_plan(shard_map(cfg, Placement.parse(src), value_head),
                        shard_map(cfg, Placement.parse(dst), value_head), itemsize)
    mover = Reallocator(plan, rank, bucket_bytes, timeout)
    shards = {n: t.to(device) for n, t in synthetic_shards(plan.src, rank, seed, tdt).items()}
    best, out, stats = float("inf"), None, None
    for _ in range(repeat):
        out = None  # drop the previous copy first: peak memory stays one destination copy
        sync(timeout)
        t0 = time.perf_counter()
        out, stats = mover.run(shards, dtype=tdt, device=device)
        sync(timeout)
        best = min(best, time.perf_counter() - t0)
    exact = all(torch.equal(out[n].cpu(), synthetic(n, plan.dst.shapes[n], s, seed, tdt))
                for n, s in mover.dst_slices.items())
    return {"exact": exact, "sent": stats.sent, "received": stats.received, "copied": stats.copied,
            "seconds": best, "rounds": stats.rounds, "peak_buffer_bytes": stats.peak_buffer_bytes}


def p2p_bandwidth(nbytes: int = 256 << 20, iters: int = 4, a: int = 0, b: int = 1,
                  timeout: float = 300.0) -> float:
    """One-way send/recv bandwidth from rank ``a`` to rank ``b`` in GB/s (1e9 B/s), best of ``iters``
    messages of ``nbytes``; every rank must call it (the others just pass the barriers)."""
    rank, buf = dist.get_rank(), None
    if rank in (a, b):
        buf = torch.ones(nbytes, dtype=torch.uint8, device=_device())
    times = []
    wait = datetime.timedelta(seconds=timeout)
    for i in range(iters + 1):  # the first message warms up the connection
        sync(timeout)
        t0 = time.perf_counter()
        if rank == a:
            dist.isend(buf, b).wait(timeout=wait)
        elif rank == b:
            dist.irecv(buf, a).wait(timeout=wait)
        sync(timeout)
        if i:
            times.append(time.perf_counter() - t0)
    return nbytes / min(times) / 1e9
