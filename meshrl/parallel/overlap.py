"""The data-parallel gradient all-reduce overlapped with the backward pass (DDP's bucketed hooks).

The gradients of a step live in a few flat buffers, one per *bucket* of parameters (about
``bucket_bytes`` each, parameters in reverse model order: the order the backward finishes them).
Each parameter's ``.grad`` is a view into its bucket, so autograd accumulates the micro-batches
straight into the buffers, and an all-reduce works on a buffer in place (no concatenation and no
copy back: no memory beyond the gradients themselves).

During the **last** micro-batch's backward only (earlier micro-batches are still accumulating), a
post-accumulate-grad hook marks each parameter ready; when every parameter of a bucket is, the
bucket's asynchronous all-reduce starts while the backward goes on through the earlier layers.
``finish`` launches what is left (parameters that got no gradient, e.g. unused experts, keep the
zeros they started with) and waits for everything, with a deadline, before the optimizer step.

Buckets are launched strictly in bucket order (bucket k waits for buckets < k, as DDP does): the
collectives of a group must be issued in the same order on every rank, and which gradient autograd
finishes first may differ between ranks. Sums are linear, so reducing over dp here and over the
other axes (tied embedding, replicated KV heads, tp) afterwards gives the same gradients as before,
up to summation order.
"""

from __future__ import annotations

import datetime

import torch
from torch import nn

from . import comm
from .groups import Axis


class GradBuckets:
    """Bucketed, overlapped all-reduce of the gradients of ``params`` (unique, model order) over ``axis``."""

    def __init__(self, params: list[nn.Parameter], axis: Axis, bucket_bytes: int,
                 timeout: datetime.timedelta) -> None:
        self.axis, self.timeout, self.bucket_bytes = axis, timeout, bucket_bytes
        self.buckets: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed(params):  # the backward reaches the last layers first
            nbytes = p.numel() * p.element_size()
            if not self.buckets or self.buckets[-1][0].dtype != p.dtype or size + nbytes > bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._flats: list[torch.Tensor] = []
        self._left: list[int] = []
        self._works: list = []
        self.armed = False
        self.launched_in_backward = 0  # buckets whose all-reduce started from a hook (tests read it)
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in params]

    def prepare(self) -> None:
        """Before the first micro-batch: every ``.grad`` becomes a view of its (zeroed) bucket; a
        gradient already there (accumulated by an earlier forward_backward) is copied in."""
        self._flats = []
        for bucket in self.buckets:
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            off = 0
            for p in bucket:
                view = flat[off:off + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                off += p.numel()
            self._flats.append(flat)

    def arm(self) -> None:
        """Right before the last micro-batch's backward: from now on a finished gradient counts."""
        self._left = [len(b) for b in self.buckets]
        self._works, self.launched_in_backward, self.armed = [], 0, True

    def _ready(self, p: nn.Parameter) -> None:
        if not self.armed:
            return
        b = self._bucket_of[id(p)]
        flat = self._flats[b]
        if not flat.data_ptr() <= p.grad.data_ptr() < flat.data_ptr() + flat.nbytes:
            self._rebind(p, b)  # autograd replaced the view (it accumulates in place, but be sure)
        self._left[b] -= 1
        while len(self._works) < len(self.buckets) and self._left[len(self._works)] == 0:
            self._launch()
            self.launched_in_backward += 1

    def _rebind(self, p: nn.Parameter, b: int) -> None:
        off = 0
        for q in self.buckets[b]:
            if q is p:
                break
            off += q.numel()
        view = self._flats[b][off:off + p.numel()].view_as(p)
        view.copy_(p.grad)
        p.grad = view

    def _launch(self) -> None:
        self._works.append(comm.all_reduce(self._flats[len(self._works)], self.axis.group, async_op=True))

    def finish(self) -> None:
        """After the last backward: launch the buckets not yet launched (in order), wait for all."""
        self.armed = False
        while len(self._works) < len(self.buckets):
            for p in self.buckets[len(self._works)]:
                flat = self._flats[len(self._works)]
                if p.grad is None or not flat.data_ptr() <= p.grad.data_ptr() < flat.data_ptr() + flat.nbytes:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._rebind(p, len(self._works))
            self._launch()
        for work in self._works:
            comm.wait(work, self.timeout)
        self._works, self._flats = [], []  # the .grad views keep the buffers until zero_grad

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
