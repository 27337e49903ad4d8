"""Moving a call's outputs between ranks: point-to-point messages on the world group, with deadlines.

A batch part (named tensors plus the row index it was split with) is serialised with torch.save
into one uint8 tensor and sent as two messages: its length on the control plane (a count, CPU/gloo),
then its bytes on the data plane (on the compute device, so NCCL carries it on a GPU). Sends are
non-blocking, so a rank that is both a sender and a receiver never waits on itself; every rank
posts its messages in the global step order, so the pairs match without tags.

In a dry run (fake process group: no bytes move) the part itself goes through the dry run's
mailbox (``MAILBOX``, meshrl/runtime/fake_world.py) and the receiver makes tensors of its shapes.
"""

from __future__ import annotations

import datetime
import io

import torch
import torch.distributed as dist

from ..algo.batch import Batch
from ..parallel import comm

MAILBOX: list = [None]  # the dry run's Mailbox while one runs (fake_world.py)


def _encode(part: Batch) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save({"data": part.data, "index": part.index}, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _decode(raw: torch.Tensor) -> Batch:
    """The part, its tensors on this rank's compute device."""
    obj = torch.load(io.BytesIO(raw.cpu().numpy().tobytes()), weights_only=True,
                     map_location=comm.compute_device())
    return Batch(obj["data"], obj["index"])


def _like(part: Batch) -> Batch:
    """New tensors of ``part``'s shapes and dtypes on this rank (a dry run's received part)."""
    dev = comm.compute_device()
    data = {k: torch.empty(v.shape, dtype=v.dtype, device=dev) for k, v in part.data.items()}
    index = None if part.index is None else torch.empty(part.index.shape, dtype=part.index.dtype)
    return Batch(data, index)


class Outbox:
    """Pending non-blocking sends of one step; ``wait`` bounds them by the deadline."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.works: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, part: Batch, dst: int) -> int:
        """Queue ``part`` for rank ``dst``; returns the bytes sent."""
        if MAILBOX[0] is not None:
            MAILBOX[0].post(dist.get_rank(), dst, part)
            return sum(t.numel() * t.element_size() for t in part.data.values())
        payload = _encode(part).to(comm.compute_device())
        self.works.append(comm.send_count(payload.numel(), dst, comm.control(None)))
        self.works.append((comm.isend(payload, dst), payload))
        return payload.numel()

    def wait(self) -> None:
        for work, _ in self.works:
            work.wait(self.timeout)
        self.works.clear()


def recv_part(src: int, timeout_s: float) -> Batch:
    """Receive one batch part sent by ``Outbox.send`` on rank ``src``."""
    if MAILBOX[0] is not None:
        return _like(MAILBOX[0].take(src, dist.get_rank()))
    timeout = datetime.timedelta(seconds=timeout_s)
    n = comm.recv_count(src, timeout, comm.control(None))
    payload = torch.empty(n, dtype=torch.uint8, device=comm.compute_device())
    comm.irecv(payload, src).wait(timeout)
    return _decode(payload)


def exchange(parts: dict[int, Batch], senders: tuple[int, ...], receivers: tuple[int, ...], rank: int,
             timeout_s: float) -> tuple[Batch | None, int]:
    """One transfer step. ``parts``: {dp replica: its output rows} that this rank holds (sender ranks
    hold the replica at their index in ``senders``). Every sender sends its replica to every receiver
    but itself; each receiver returns the merged batch (rows back in their original order).
    Returns (merged batch or None, bytes this rank sent)."""
    sent = 0
    out = Outbox(timeout_s)
    for d, s in enumerate(senders):
        if s == rank:
            for r in receivers:
                if r != rank:
                    sent += out.send(parts[d], r)
    merged = None
    if rank in receivers:
        got = [parts[d] if s == rank else recv_part(s, timeout_s) for d, s in enumerate(senders)]
        merged = Batch.merge(got) if len(got) > 1 or got[0].index is not None else got[0]
    out.wait()
    return merged, sent
