"""Executing one rank on fake tensors: values become placeholders, data-dependent shapes their worst
case, and every byte the rank allocates is counted (for ``meshrl plan --dry-run``, dry_run.py).

``FakeRank`` is a TorchDispatchMode entered above torch's ``FakeTensorMode`` (shapes, dtypes and
devices, no storage). It sees every op the rank runs and

- answers a read of a value to Python (``.item()``, ``.tolist()``, ``int(t)``, ``bool(t)``:
  aten's ``_local_scalar_dense``, ``is_nonzero``) with a placeholder (1, 1.0 or False;
  ``placeholders`` counts them), so
  statistics, rewards and decoded text are meaningless in a dry run; where the code branches on
  such a value in a way that changes shapes or collectives it asks meshrl.model.worst_case instead;
- gives the data-dependent shapes their worst case: ``nonzero`` (and so ``torch.where(mask)``) and
  boolean-mask indexing select every element (no row dropped, no padding removed);
- counts live bytes: each new storage an op returns is added, and a weak reference on the storage
  subtracts it when it is freed (views and in-place results share a storage and count once). An
  op whose kernel allocates a temporary of its own, out of this mode's sight, adds it to the peak
  while it runs (``WORKSPACE``: torch.logsumexp's shifted input, exponentiated in place).
  ``live`` / ``peak`` are the rank's bytes now and at most since ``start_window``; ``top`` lists
  the largest storages made in the window and alive at its peak, when it exceeded its budget.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
TOP = 4  # storages named when a window exceeds its budget
# reads of a value to Python: item() / tolist() / int(); bool(t); torch.equal
_SCALARS = (aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default)
# Bytes an op's kernel holds in temporaries while it runs, which a dispatch mode does not see (the
# kernel calls other ops below it). logsumexp (ReduceOps.cpp, on every device): (x - max).exp_(),
# one tensor of the input's size and dtype, then its sum.
WORKSPACE: dict = {aten.logsumexp.default: lambda x, *_: x.numel() * x.element_size()}


@dataclass
class Alloc:
    """One live storage: its bytes and the op, shape and dtype that made it."""

    nbytes: int
    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    seq: int = 0  # allocation number on the rank

    def what(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"{self.op} -> {list(self.shape)} {dtype} ({self.nbytes / 2**20:.1f} MiB)"


@dataclass
class Window:
    """One step's memory: bytes live at its start, the peak during it, the storages at an over-budget peak."""

    start: int = 0
    peak: int = 0
    budget: float | None = None
    top: list[Alloc] = field(default_factory=list)  # the largest made in the window, alive at its peak
    first: int = 0  # the first allocation number of the window


def _placeholder(t: torch.Tensor):
    if t.dtype == torch.bool:
        return False
    return 1.0 if t.dtype.is_floating_point or t.dtype.is_complex else 1  # 1: a count or norm one may divide by


def _all_indices(mask: torch.Tensor) -> list[torch.Tensor]:
    """A boolean mask's worst-case selection: one long index per dimension, every element."""
    n = mask.numel()
    return [torch.empty(n, dtype=torch.long, device=mask.device) for _ in range(mask.dim())]


class FakeRank(TorchDispatchMode):
    """See the module docstring. Enter it inside (above) a FakeTensorMode."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.placeholders = 0
        self.seq = 0
        self.window = Window()
        self._allocs: dict[int, Alloc] = {}  # storage id (_cdata) -> what made it
        self.check: Callable[[tuple[int, ...], int, str], None] | None = None  # (shape, bytes, op) of each new storage

    def start_window(self, budget: float | None = None) -> Window:
        """Start measuring a step: the peak from the bytes live now; ``budget``: bytes above which
        the largest live storages are recorded at the peak."""
        self.window = Window(self.live, self.live, budget, first=self.seq)
        return self.window

    def _freed(self, key: int) -> None:
        a = self._allocs.pop(key, None)
        if a is not None:
            self.live -= a.nbytes

    def _count(self, out, func) -> None:
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            n = st.nbytes()
            if n == 0 or key in self._allocs:
                continue
            self.seq += 1
            self._allocs[key] = Alloc(n, str(func.overloadpacket.__name__), tuple(t.shape), t.dtype, self.seq)
            self.live += n
            weakref.finalize(st, self._freed, key)
            if self.check is not None:
                self.check(tuple(t.shape), n, self._allocs[key].op)
        w = self.window
        if self.live > w.peak:
            w.peak = self.live
            if w.budget is not None and self.live > w.budget:
                new = [a for a in self._allocs.values() if a.seq > w.first]  # made in the window
                w.top = sorted(new, key=lambda a: -a.nbytes)[:TOP]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SCALARS:
            self.placeholders += 1
            return False if func is not aten._local_scalar_dense.default else _placeholder(args[0])
        if func is aten.nonzero.default:
            a = args[0]
            out = torch.empty((a.numel(), a.dim()), dtype=torch.long, device=a.device)
        elif func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            idx = [j for i in args[1] for j in ([i] if i is None or i.dtype != torch.bool else _all_indices(i))]
            out = func(args[0], idx)
        else:
            out = func(*args, **kwargs)
        temp = WORKSPACE.get(func)
        if temp is not None:  # the kernel's own temporary, alive beside its output while it ran
            self.window.peak = max(self.window.peak, self.live + temp(*args, **kwargs))
        self._count(out, func)
        return out


def _nested(shape: tuple[int, ...], value) -> list | object:
    return value if not shape else [_nested(shape[1:], value) for _ in range(shape[0])]


@contextmanager
def fast_tolist() -> Iterator[None]:
    """``Tensor.tolist`` of a fake tensor as nested lists of the placeholder, at once (torch would
    select and read every element, hundreds of microseconds each under fake mode: decoding a
    batch's responses to text would take minutes)."""
    real = FakeTensor.tolist

    def tolist(self):
        return _nested(tuple(self.shape), _placeholder(self))

    FakeTensor.tolist = tolist
    try:
        yield
    finally:
        FakeTensor.tolist = real
