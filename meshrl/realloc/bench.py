"""Rank-side work of ``meshrl bench realloc`` (and of the executor tests): move a model between two
placements with synthetic weights, check every element, and measure point-to-point bandwidth.

Functions here run on every rank of a RankPool (module level, so they pickle by reference).
"""

from __future__ import annotations

import datetime
import statistics
import time
from functools import partial
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..model.config import ModelConfig
from ..layout.mesh import Placement
from .executor import DEFAULT_BUCKET_BYTES, Reallocator
from ..layout.realloc_plan import realloc_plan
from ..layout.shardmap import shard_map
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


def _timed(fn: Callable[[], Any], timeout: float) -> tuple[float, Any]:
    """(seconds from a common barrier to a common barrier around fn(), its result)."""
    sync(timeout)
    t0 = time.perf_counter()
    res = fn()
    sync(timeout)
    return time.perf_counter() - t0, res


def _p2p_sender(nbytes: int, a: int, b: int, timeout: float):
    """A function that sends one ``nbytes`` message from rank a to rank b (a no-op elsewhere)."""
    rank, wait = dist.get_rank(), datetime.timedelta(seconds=timeout)
    buf = torch.ones(nbytes, dtype=torch.uint8, device=_device()) if rank in (a, b) else None

    def once() -> None:
        if rank == a:
            dist.isend(buf, b).wait(timeout=wait)
        elif rank == b:
            dist.irecv(buf, a).wait(timeout=wait)
    return once


def _links_sender(link_bytes: dict[tuple[int, int], int], timeout: float):
    """A function that sends, at once, one plain preallocated message per link with that link's
    byte count: the same traffic as the reallocation with nothing else (no slicing, no packing)."""
    rank, wait = dist.get_rank(), datetime.timedelta(seconds=timeout)
    mine = sorted((k, n) for k, n in link_bytes.items() if rank in k)
    bufs = [torch.ones(n, dtype=torch.uint8, device=_device()) for _, n in mine]

    def once() -> None:
        ops = [dist.P2POp(dist.isend if s == rank else dist.irecv, buf, d if s == rank else s)
               for ((s, d), _), buf in zip(mine, bufs, strict=True)]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait(timeout=wait)
    return once


def move_and_check(cfg: ModelConfig, src: str, dst: str, value_head: bool = False, seed: int = 0,
                   dtype: str = "fp32", bucket_bytes: int = DEFAULT_BUCKET_BYTES, repeat: int = 1,
                   timeout: float = 300.0, p2p: tuple[int, int, int] | None = None) -> dict:
    """Move synthetic weights from placement ``src`` to ``dst`` (e.g. 'dp2tp2pp1@0-3') on this rank,
    ``repeat`` times, then check every element received.

    Each repeat times, side by side: a fresh destination copy (``fresh_s``: allocate and fill, the
    temporary-copy use), a refresh of that copy in place (``refresh_s``: the shadow use) and, with
    ``p2p=(nbytes, a, b)``, one plain message from rank a to rank b (``p2p_s``) and the plan's
    per-link byte counts as plain concurrent messages (``links_s``). Every time runs
    from a common barrier to a common barrier. Also returns this rank's byte counts and stats."""
    rank, tdt = dist.get_rank(), DTYPES[dtype]
    device = _device()
    itemsize = torch.empty((), dtype=tdt).element_size()
    plan = realloc_plan(shard_map(cfg, Placement.parse(src), value_head),
                        shard_map(cfg, Placement.parse(dst), value_head), itemsize)
    mover = Reallocator(plan, rank, bucket_bytes, timeout)
    shards = {n: t.to(device) for n, t in synthetic_shards(plan.src, rank, seed, tdt).items()}
    send = _p2p_sender(*p2p, timeout) if p2p else None
    links = _links_sender(plan.link_bytes(), timeout) if p2p else None
    if send:
        _timed(send, timeout)  # warm the connections up
        _timed(links, timeout)
    times: dict[str, list[float]] = {"fresh_s": [], "refresh_s": [], "p2p_s": [], "links_s": []}
    out, stats = None, None
    for _ in range(repeat):
        out = None  # drop the previous copy first: peak memory stays one destination copy
        dt, (out, stats) = _timed(partial(mover.run, shards, dtype=tdt, device=device), timeout)
        times["fresh_s"].append(dt)
        dt, _ = _timed(partial(mover.run, shards, out=out, dtype=tdt, device=device), timeout)
        times["refresh_s"].append(dt)
        if send:
            times["p2p_s"].append(_timed(send, timeout)[0])
            times["links_s"].append(_timed(links, timeout)[0])
    exact = all(torch.equal(out[n].cpu(), synthetic(n, plan.dst.shapes[n], s, seed, tdt))
                for n, s in mover.dst_slices.items())
    return {"exact": exact, "sent": stats.sent, "received": stats.received, "copied": stats.copied,
            "rounds": stats.rounds, "peak_buffer_bytes": stats.peak_buffer_bytes,
            "pack_s": stats.pack_s, "wait_s": stats.wait_s, "unpack_s": stats.unpack_s,
            "copy_s": stats.copy_s, **times}


def p2p_bandwidth(nbytes: int = 256 << 20, iters: int = 4, a: int = 0, b: int = 1,
                  timeout: float = 300.0) -> float:
    """One-way send/recv bandwidth from rank ``a`` to rank ``b`` in GB/s (1e9 B/s), median of
    ``iters`` messages of ``nbytes`` after one warm-up; every rank must call it."""
    send = _p2p_sender(nbytes, a, b, timeout)
    _timed(send, timeout)
    return nbytes / statistics.median(_timed(send, timeout)[0] for _ in range(iters)) / 1e9
