"""A role's training state in a layout-independent form: full-parameter-name keys, each held as
rectangular chunks of the full tensor, with the rank that writes each chunk (one per distinct
chunk: data-parallel replicas, tp ranks sharing a replicated slice and the two stages holding a
tied embedding write it once).

    {role}/param/{name}        the weights (this rank's ShardMap slice of ``name``)
    {role}/master/{name}       fp32 master weights (ZeRO-1 chunks; only when the weights are not fp32)
    {role}/exp_avg/{name}      AdamW's first moment  (ZeRO-1 chunks)
    {role}/exp_avg_sq/{name}   AdamW's second moment (ZeRO-1 chunks)

A ZeRO-1 chunk is a range ``[lo, hi)`` of the *flattened* local slice (meshrl/parallel/data.py),
which is not a rectangle of the full tensor; ``flat_blocks`` cuts it into at most 2·ndim - 1
rectangles, each a contiguous part of the range, so every chunk is stored as full-tensor
rectangles and any other layout reads it back by intersecting rectangles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..parallel.model import ParallelModel

Rect = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) in some tensor's coordinates


def flat_blocks(shape: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, Rect]]:
    """The flat range [lo, hi) of a C-ordered tensor of ``shape`` as rectangles, in order:
    [(flat start, (offsets, sizes))]; each rectangle covers flat positions start .. start+numel-1."""
    if lo >= hi:
        return []
    if len(shape) <= 1:
        return [(lo, ((lo,), (hi - lo,)))] if shape else [(0, ((), ()))]
    inner = 1
    for n in shape[1:]:
        inner *= n
    out: list[tuple[int, Rect]] = []

    def row_part(row: int, a: int, b: int) -> None:  # [a, b) inside one row
        for start, (offs, sizes) in flat_blocks(shape[1:], a - row * inner, b - row * inner):
            out.append((row * inner + start, ((row, *offs), (1, *sizes))))

    if lo % inner:
        end = min(hi, (lo // inner + 1) * inner)
        row_part(lo // inner, lo, end)
        lo = end
    rows = (hi - lo) // inner
    if rows > 0:
        out.append((lo, ((lo // inner, *[0] * (len(shape) - 1)), (rows, *shape[1:]))))
        lo += rows * inner
    if lo < hi:
        row_part(lo // inner, lo, hi)
    return out


@dataclass
class Piece:
    """One rectangle of a full tensor held by this rank. ``get()`` is its data (a copy on the
    CPU); ``put(t)`` writes a tensor of the rectangle's shape back into the live state."""

    key: str
    shape: tuple[int, ...]  # the full tensor's
    dtype: torch.dtype
    rect: Rect  # in the full tensor
    write: bool  # whether this rank is the one that saves it
    get: Callable[[], torch.Tensor]
    put: Callable[[torch.Tensor], None]


def _host(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the host: a copy from a GPU, the tensor itself (a view) on a CPU; the writer
    copies only views that share storage (checkpoint._rank_files), as safetensors requires."""
    return t.detach().cpu()


def _first(sm, rank: int, name: str, same_dp: bool) -> bool:
    """Whether ``rank`` is the first rank in mesh order holding its slice of ``name`` (within its
    data-parallel replica index when ``same_dp``: ZeRO chunks differ between dp ranks)."""
    mine = sm.slice_of(rank, name)
    dp = sm.placement.coords_of(rank)[0]
    same = [r for r, s in sm.holders(name) if s == mine and (not same_dp or sm.placement.coords_of(r)[0] == dp)]
    return same[0] == rank


def _unique_params(pm: ParallelModel) -> list[str]:
    """The parameter names in the order ZeroAdamW keeps them (a tied parameter at its first name)."""
    seen: dict[int, str] = {}
    for n, p in pm.named.items():
        seen.setdefault(id(p), n)
    return list(seen.values())


def role_pieces(role: str, pm: ParallelModel, rank: int) -> list[Piece]:
    """Every rectangle of ``role``'s state that this rank holds in ``pm`` (its home model)."""
    sm, out = pm.sm, []
    held = sm.params_of(rank)
    for name, p in pm.named.items():
        sl = held[name]
        rect = (tuple(a for a, _ in sl), tuple(b - a for a, b in sl))
        out.append(Piece(f"{role}/param/{name}", sm.shapes[name], p.dtype, rect, _first(sm, rank, name, False),
                         lambda p=p: _host(p), lambda t, p=p: p.data.copy_(t)))
    opt = pm.optimizer
    if opt is None:
        return out
    names = _unique_params(pm)
    assert len(names) == len(opt.params) and all(pm.named[n] is q for n, q in zip(names, opt.params, strict=True))
    for name, p, chunk, (lo, hi, _) in zip(names, opt.params, opt.chunks, opt.bounds, strict=True):
        origin = tuple(a for a, _ in held[name])
        write = _first(sm, rank, name, True)
        st = opt.opt.state[chunk]
        kinds = {"exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"]}
        if p.dtype != chunk.dtype:
            kinds["master"] = chunk.data
        for kind, flat in kinds.items():
            for start, (offs, sizes) in flat_blocks(tuple(p.shape), lo, hi):
                n = 1
                for s in sizes:
                    n *= s
                view = flat.view(-1)[start - lo:start - lo + n]
                rect = (tuple(o + a for o, a in zip(offs, origin, strict=True)), sizes)
                out.append(Piece(f"{role}/{kind}/{name}", sm.shapes[name], flat.dtype, rect, write,
                                 lambda v=view, s=sizes: _host(v).view(s),
                                 lambda t, v=view: v.copy_(t.reshape(-1))))
    return out


def optimizer_step(pm: ParallelModel) -> float | None:
    """AdamW's step count of ``pm`` (the same for every chunk), or None without an optimizer."""
    if pm.optimizer is None:
        return None
    steps = {float(s["step"]) for s in pm.optimizer.opt.state.values()}
    assert len(steps) <= 1, f"AdamW chunks disagree on the step count: {steps}"
    return steps.pop() if steps else 0.0


def set_optimizer_step(pm: ParallelModel, step: float) -> None:
    for s in pm.optimizer.opt.state.values():
        s["step"].fill_(step)
