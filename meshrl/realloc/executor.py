"""Run a ReallocPlan on real ranks with torch.distributed (gloo or NCCL), in bounded buckets.

Why our own: torch's DTensor redistribute moves between placements of one DeviceMesh; we move
between any two meshes (equal, overlapping or disjoint) and TP sizes that do not divide each other.

Each rank passes its source shards ``{name: tensor}`` (exactly the source ShardMap's slices) and
gets its destination shards. Per round every link moves one bucket with batched isend/irecv (see
schedule.py), and round r+1 is posted before round r is waited for, so that links never drain;
the local copies (slices the rank holds itself) are made while the first two rounds are in flight.

Memory bound: besides its source and destination shards, a rank holds at most two rounds of
buffers, i.e. peak extra memory <= 2 x bucket_bytes x (send peers + receive peers); only strided
or packed pieces need a buffer (a contiguous piece is sent from, or received into, its place), so
RunStats.peak_buffer_bytes is usually far below the bound. Ranks in neither mesh do nothing. Every
wait has a deadline.

The two runtime uses:
- a temporary copy in a call's layout: ``shards = r.run(home_shards)``; drop it with ``del``;
- refreshing a long-lived shadow copy in place: ``r.run(home_shards, out=shadow_shards)``.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..layout.realloc_plan import ReallocPlan
from ..parallel import comm
from .schedule import Bucket, link_buckets, rank_rounds
from ..layout.shardmap import Slice

DEFAULT_BUCKET_BYTES = 32 << 20


@dataclass
class RunStats:
    """What one rank moved: bytes sent / received over links, bytes copied locally, rounds, seconds."""

    sent: int = 0
    received: int = 0
    copied: int = 0
    rounds: int = 0
    peak_buffer_bytes: int = 0
    seconds: float = 0.0
    pack_s: float = 0.0  # copying pieces into send buffers and posting the messages
    wait_s: float = 0.0  # waiting for the messages of a round
    unpack_s: float = 0.0  # copying received buffers into the destination shards
    copy_s: float = 0.0  # the local copies (made while the first two rounds are on the wire)


def _view(t: torch.Tensor, region: Slice, origin: Slice) -> torch.Tensor:
    """The part of local shard ``t`` (holding full-tensor slice ``origin``) that is ``region``."""
    return t[tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(region, origin, strict=True))]


class Reallocator:
    """A plan bound to one rank, with its bucket schedule computed once (reuse it every iteration)."""

    def __init__(self, plan: ReallocPlan, rank: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float = 300.0) -> None:
        self.plan, self.rank, self.timeout = plan, rank, timeout
        self.rounds = rank_rounds(link_buckets(plan, bucket_bytes), rank)
        self.copies = [t for t in plan.copies if t.dst == rank]
        self.src_slices = plan.src.params_of(rank) if rank in plan.src.placement.mesh else {}
        self.dst_slices = plan.dst.params_of(rank) if rank in plan.dst.placement.mesh else {}

    def _check_inputs(self, src: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        if set(src) != set(self.src_slices):
            missing, extra = set(self.src_slices) - set(src), set(src) - set(self.src_slices)
            raise ValueError(f"rank {self.rank}: source shards differ from the source ShardMap "
                             f"(missing {sorted(missing)[:3]}, unexpected {sorted(extra)[:3]})")
        for name, t in src.items():
            want = tuple(b - a for a, b in self.src_slices[name])
            if tuple(t.shape) != want or t.dtype != dtype:
                raise ValueError(f"rank {self.rank}: source shard {name} is {tuple(t.shape)} {t.dtype}, "
                                 f"the plan expects {want} {dtype}")
        if torch.empty((), dtype=dtype).element_size() != self.plan.dtype_bytes:
            raise ValueError(f"plan counts {self.plan.dtype_bytes} bytes per element but tensors are {dtype}")

    def _alloc(self, out: dict[str, torch.Tensor] | None, dtype: torch.dtype,
               device: torch.device) -> dict[str, torch.Tensor]:
        if out is None:
            # One tensor per parameter, not one flat buffer with views: on CPU, glibc's malloc serves
            # blocks below its mmap threshold (which rises to the size of freed blocks, up to 32 MiB)
            # from its heap and reuses them, so the next copy mostly skips page faults; one flat
            # buffer is a fresh mmap every time (measured in docs/realloc.md).
            return {n: torch.empty(tuple(b - a for a, b in s), dtype=dtype, device=device)
                    for n, s in self.dst_slices.items()}
        for n, s in self.dst_slices.items():
            want = tuple(b - a for a, b in s)
            if n not in out or tuple(out[n].shape) != want:
                raise ValueError(f"rank {self.rank}: destination shard {n} must be given with shape {want}")
        return out

    def run(self, src: dict[str, torch.Tensor], out: dict[str, torch.Tensor] | None = None,
            dtype: torch.dtype | None = None, device: torch.device | None = None,
            ) -> tuple[dict[str, torch.Tensor], RunStats]:
        """Move this rank's ``src`` shards; return its destination shards (``out`` if given) and stats.

        ``dtype``/``device`` are needed only on a rank that holds no source shard."""
        some = next(iter(src.values()), None)
        dtype = dtype or (some.dtype if some is not None else None)
        device = device or (some.device if some is not None else _default_device())
        if dtype is None:
            if self.dst_slices:
                raise ValueError(f"rank {self.rank} holds no source shard: pass dtype")
            dtype = torch.float32
        self._check_inputs(src, dtype)
        stats, t0 = RunStats(), time.perf_counter()
        dst = self._alloc(out, dtype, device)
        self._rounds(src, dst, dtype, device, stats)
        stats.seconds = time.perf_counter() - t0
        return dst, stats

    def _copy_local(self, src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], stats: RunStats) -> None:
        """The plan's local copies (the destination rank holds those source slices itself)."""
        t0 = time.perf_counter()
        for t in self.copies:
            _view(dst[t.name], t.region, self.dst_slices[t.name]).copy_(
                _view(src[t.name], t.region, self.src_slices[t.name]))
            stats.copied += t.nbytes
        stats.copy_s += time.perf_counter() - t0

    def _rounds(self, src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device, stats: RunStats) -> None:
        """Post round r+1 before finishing round r, so links never drain between rounds: at most two
        rounds are in flight, hence the bound of 2 buckets per peer and direction."""
        tags: dict[tuple[str, int], int] = {}
        pending: _Posted | None = None
        copied = False
        for sends, recvs in self.rounds:
            posted = self._post(sends, recvs, src, dst, dtype, device, tags, stats)
            stats.peak_buffer_bytes = max(stats.peak_buffer_bytes,
                                          posted.extra + (pending.extra if pending else 0))
            if pending is not None:
                if not copied:  # local copies need no peer: make them while two rounds are on the wire
                    self._copy_local(src, dst, stats)
                    copied = True
                self._finish(pending, stats)
            pending = posted
        if not copied:
            self._copy_local(src, dst, stats)
        if pending is not None:
            self._finish(pending, stats)

    def _post(self, sends: list[Bucket], recvs: list[Bucket], src: dict[str, torch.Tensor],
              dst: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
              tags: dict[tuple[str, int], int], stats: RunStats) -> "_Posted":
        """Start one round's messages: per bucket, its direct pieces in order, then the packed rest.
        Each message to or from a peer gets the next tag of that peer, so that on gloo two rounds in
        flight never mix (NCCL matches point-to-point messages in order anyway)."""
        t0 = time.perf_counter()
        ops, inbox, extra = [], [], 0

        def op(fn, buf: torch.Tensor, peer: int) -> None:
            key = (fn.__name__, peer)
            tags[key] = tags.get(key, -1) + 1
            ops.append(comm.p2p_op(fn is comm.isend, buf, peer, tag=tags[key]))

        for b in sends:
            views = [_view(src[p.name], p.region, self.src_slices[p.name]) for p in b.pieces]
            for v in (v for v, d in zip(views, b.direct, strict=True) if d):
                extra += 0 if v.is_contiguous() else v.numel() * v.element_size()
                op(comm.isend, v.reshape(-1), b.dst)  # reshape copies only a strided piece
            rest = [v.reshape(-1) for v, d in zip(views, b.direct, strict=True) if not d]
            if rest:
                buf = torch.cat(rest)
                extra += buf.numel() * buf.element_size()
                op(comm.isend, buf, b.dst)
            stats.sent += b.nbytes
        for b in recvs:
            views = [_view(dst[p.name], p.region, self.dst_slices[p.name]) for p in b.pieces]
            groups = [[v] for v, d in zip(views, b.direct, strict=True) if d]
            rest = [v for v, d in zip(views, b.direct, strict=True) if not d]
            for group in groups + ([rest] if rest else []):
                if len(group) == 1 and group[0].is_contiguous():
                    op(comm.irecv, group[0].view(-1), b.src)  # straight into place
                    continue
                buf = torch.empty(sum(v.numel() for v in group), dtype=dtype, device=device)
                extra += buf.numel() * buf.element_size()
                inbox.append((group, buf))
                op(comm.irecv, buf, b.src)
            stats.received += b.nbytes
        works = comm.batch_isend_irecv(ops)
        stats.pack_s += time.perf_counter() - t0
        return _Posted(works, inbox, [o.tensor for o in ops], extra)

    def _finish(self, posted: "_Posted", stats: RunStats) -> None:
        t0 = time.perf_counter()
        for work in posted.works:
            work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        t1 = time.perf_counter()
        for views, buf in posted.inbox:
            at = 0
            for view in views:
                view.copy_(buf[at:at + view.numel()].view(view.shape))
                at += view.numel()
        stats.rounds += 1
        stats.wait_s += t1 - t0
        stats.unpack_s += time.perf_counter() - t1


@dataclass
class _Posted:
    """One round in flight: its works, the buffers to unpack, and every buffer kept alive until done."""

    works: list
    inbox: list[tuple[list[torch.Tensor], torch.Tensor]]
    keep: list[torch.Tensor]
    extra: int


def _default_device() -> torch.device:
    return comm.compute_device()


def reallocate(plan: ReallocPlan, src: dict[str, torch.Tensor], out: dict[str, torch.Tensor] | None = None,
               bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float = 300.0,
               dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], RunStats]:
    """One-shot: run ``plan`` on this rank (``dist.get_rank()``); see Reallocator.run."""
    return Reallocator(plan, dist.get_rank(), bucket_bytes, timeout).run(src, out, dtype)
