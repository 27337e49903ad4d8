"""A rank's peak memory during one call, as ``meshrl plan --validate`` compares it with the planner.

- CUDA: ``torch.cuda.max_memory_allocated`` between a reset before the call and its end (every
  iteration; the allocator keeps the count at no cost).
- CPU: there is no allocator count, so the peak is counted as the planner models it: the bytes of
  the live tensors this rank *holds* when the call starts (every role's parameters on the device,
  gradients, optimizer state and master weights, copies; offloaded models excluded), plus the most
  bytes that tensors made *during* the call held at once (activations, gradients, buffers,
  collectives' outputs). The second term comes from a TorchDispatchMode that sees every op's output
  storage and a weak reference that sees it freed; views and in-place results share a storage and
  are counted once. It costs Python work per op, so it runs only when ``MESHRL_MEASURE_MEM=1``
  (validation sets it) and only in iteration 0, the warm-up iteration the time comparison skips.
"""

from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def enabled() -> bool:
    return os.environ.get("MESHRL_MEASURE_MEM", "0") not in ("", "0")


class _LiveBytes(TorchDispatchMode):
    """Bytes of the storages made under this mode that are still alive, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, int] = {}  # storage data_ptr -> bytes

    def _freed(self, key: int) -> None:
        self.live -= self._seen.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            # oneDNN's packed weights (decode_weights.Packed) are opaque: no storage to ask, their own bytes
            st = t if t.is_mkldnn else t.untyped_storage()
            key, n = (id(t), t.numel() * t.element_size()) if t.is_mkldnn else (st.data_ptr(), st.nbytes())
            if n == 0 or key in self._seen or key in _held_ptrs:
                continue
            self._seen[key] = n
            self.live += n
            weakref.finalize(st, self._freed, key)
        self.peak = max(self.peak, self.live)
        return out


_held_ptrs: set[int] = set()  # storages counted as held at the call's start (not counted twice)


def held_tensors(roles: dict) -> list[torch.Tensor]:
    """Every tensor this rank holds for its roles: parameters (not offloaded), gradients, optimizer
    state and fp32 master chunks."""
    out: list[torch.Tensor] = []
    for rm in roles.values():
        for pl, pm in rm.models.items():
            if pl in rm.offloaded:
                continue
            for p in pm.named.values():
                out.append(p.detach())
                if p.grad is not None:
                    out.append(p.grad)
            opt = pm.optimizer
            if opt is not None:
                out += [c.detach() for c in opt.chunks]
                out += [t for s in opt.opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return out


def storage_bytes(tensors: list[torch.Tensor]) -> tuple[int, set[int]]:
    """Bytes of the distinct storages behind ``tensors`` (views counted once), and their pointers."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values()), set(seen)


@contextmanager
def call_peak(roles: dict, device: torch.device, box: dict) -> Iterator[None]:
    """Measure the rank's peak bytes during the block into ``box["peak"]`` (see the module doc)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield
        torch.cuda.synchronize(device)
        box["peak"] = float(torch.cuda.max_memory_allocated(device))
        return
    held, ptrs = storage_bytes(held_tensors(roles))
    _held_ptrs.clear()
    _held_ptrs.update(ptrs)
    mode = _LiveBytes()
    try:
        with mode:
            yield
    finally:
        _held_ptrs.clear()
    box["peak"] = float(held + mode.peak)
