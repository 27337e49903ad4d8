"""Pipeline parallelism: hidden states pass stage to stage with point-to-point sends.

Schedules: training runs **1F1B** (one-forward-one-backward: stage s runs pp - s - 1 warm-up
forwards, then alternates, then drains the backwards), so a stage keeps at most pp - s micro-batches
of activations alive; inference runs forwards only; generation (generate.py) runs prefill and every
decode step through the stages, with micro-batches in flight (generate_micro.py: each stage works on
a different micro-batch, the last sends each micro-batch's new tokens back to the others).

Why not ``torch.distributed.pipelining``: its schedules own the loss and the micro-batch split and
trace a stage as one module with tensor inputs, while here a stage also needs the attention mask,
KV caches at a given offset (generation), and a loss that sees whole-mini-batch normalisation and
extra per-row tensors (advantages, old log-probs); and its stages address ranks of one default group
rather than an arbitrary sub-mesh's pp group. A stage only ever talks to its two neighbours, so a
few sends and receives with a deadline each are simpler to trust than adapting it.

Sends are non-blocking (the tensor is kept alive until its send completes) and every receive waits
with a deadline, so a broken peer fails the step instead of hanging it.
"""

from __future__ import annotations

import datetime
from typing import Callable

import torch
import torch.distributed as dist

from . import comm
from .groups import Axis

_FWD, _BWD, _TOK = 0, 1, 2  # message tags: activations travel down, gradients up, sampled tokens back


class Pipe:
    """This rank's two pipeline neighbours on its pp axis."""

    def __init__(self, axis: Axis, timeout_s: float = 300.0, device: torch.device | str = "cpu") -> None:
        self.axis = axis
        self.device = torch.device(device)
        self.first, self.last = axis.first, axis.last
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []

    def _send(self, t: torch.Tensor, dst: int, tag: int) -> None:
        t = t.detach().contiguous()
        if len(self._pending) >= 64:  # a long generation sends thousands: drop the finished ones
            self._pending = [(w, x) for w, x in self._pending if not w.is_completed()]
        self._pending.append((comm.isend(t, dst, self.axis.group, tag), t))

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        comm.irecv(buf, src, self.axis.group, tag).wait(self.timeout)
        return buf

    def send_forward(self, t: torch.Tensor) -> None:
        self._send(t, self.axis.ranks[self.axis.index + 1], _FWD)

    def recv_forward(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self._recv(shape, dtype, self.axis.ranks[self.axis.index - 1], _FWD)

    def send_backward(self, t: torch.Tensor) -> None:
        self._send(t, self.axis.ranks[self.axis.index - 1], _BWD)

    def recv_backward(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self._recv(shape, dtype, self.axis.ranks[self.axis.index + 1], _BWD)

    def send_to_stages(self, t: torch.Tensor) -> None:
        """From the last stage to every other stage (the tokens of micro-batched decoding)."""
        for dst in self.axis.ranks[:-1]:
            self._send(t, dst, _TOK)

    def recv_from_last(self, buf: torch.Tensor) -> torch.Tensor:
        """Fill ``buf`` with what the last stage sent by ``send_to_stages`` (waits with the deadline)."""
        comm.irecv(buf, self.axis.ranks[-1], self.axis.group, _TOK).wait(self.timeout)
        return buf

    def wait_sends(self) -> None:
        for work, _ in self._pending:
            work.wait(self.timeout)
        self._pending.clear()

    def broadcast_from_last(self, t: torch.Tensor) -> torch.Tensor:
        """Every stage gets the last stage's ``t`` (same shape and dtype on all stages)."""
        if self.axis.group is not None:
            comm.broadcast(t, self.axis.ranks[-1], self.axis.group)
        return t


# forward_step(i, x): micro-batch i; x is the received hidden state (None on the first stage).
# It returns the stage's output: hidden [b, S, hidden] or, on the last stage, the scalar loss
# (training) or whatever the caller wants collected (inference).
StepFn = Callable[[int, "torch.Tensor | None"], torch.Tensor]
ShapeFn = Callable[[int], tuple[int, ...]]  # micro-batch i -> hidden shape [b, S, hidden]


def train_1f1b(pipe: Pipe, n_micro: int, forward_step: StepFn, hidden_shape: ShapeFn,
               dtype: torch.dtype, before_last_backward: Callable[[], None] | None = None) -> list[torch.Tensor]:
    """Forward and backward every micro-batch in 1F1B order; return the last stage's losses.
    ``before_last_backward()`` runs right before the last micro-batch's backward on this stage
    (the overlapped gradient reduction arms its hooks there, parallel/overlap.py)."""
    inputs: dict[int, torch.Tensor | None] = {}
    outputs: dict[int, torch.Tensor] = {}
    losses: list[torch.Tensor] = []

    def fwd(i: int) -> None:
        x = None
        if not pipe.first:
            x = pipe.recv_forward(hidden_shape(i), dtype).requires_grad_()
        out = forward_step(i, x)
        if pipe.last:
            losses.append(out.detach())
        else:
            pipe.send_forward(out)
        inputs[i], outputs[i] = x, out

    def bwd(i: int) -> None:
        x, out = inputs.pop(i), outputs.pop(i)
        if i == n_micro - 1 and before_last_backward is not None:
            before_last_backward()
        if pipe.last:
            out.backward()
        else:
            out.backward(pipe.recv_backward(tuple(out.shape), dtype))
        if not pipe.first:
            pipe.send_backward(x.grad)

    warm = min(pipe.axis.size - pipe.axis.index - 1, n_micro)
    for i in range(warm):
        fwd(i)
    for i in range(warm, n_micro):
        fwd(i)
        bwd(i - warm)
    for i in range(n_micro - warm, n_micro):
        bwd(i)
    pipe.wait_sends()
    return losses


def infer(pipe: Pipe, n_micro: int, forward_step: StepFn, hidden_shape: ShapeFn,
          dtype: torch.dtype) -> list[torch.Tensor]:
    """Forward-only pipeline; returns the last stage's per-micro-batch outputs ([] elsewhere)."""
    outs = []
    for i in range(n_micro):
        x = None if pipe.first else pipe.recv_forward(hidden_shape(i), dtype)
        out = forward_step(i, x)
        if pipe.last:
            outs.append(out)
        else:
            pipe.send_forward(out)
    pipe.wait_sends()
    return outs
