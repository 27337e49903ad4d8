"""The two runtime uses of reallocation, on ParallelModels (meshrl/parallel/model.py).

- ``temporary_copy``: a call's own copy of a trained model in the call's layout, built from the
  home copy (which keeps its optimizer state and stays untouched); drop it with ``del`` after use.
- ``refresh``: overwrite a long-lived shadow copy (e.g. the disaggregated generation actor) in
  place from the home copy after each update; the shadow's tensors are reused, nothing is allocated
  but the bucket buffers.

Both take a ``Reallocator`` for this rank (build it once per (source, destination) pair and keep it:
its bucket schedule is computed once). Call them on every rank of the world, in the same order:
ranks outside both meshes pass None and return at once.
"""

from __future__ import annotations

import torch

from ..parallel.groups import GroupCache
from ..parallel.model import ParallelModel
from .executor import Reallocator, RunStats


def refresh(mover: Reallocator, home: ParallelModel | None, shadow: ParallelModel | None,
            dtype: torch.dtype = torch.float32) -> RunStats:
    """Copy ``home``'s weights into ``shadow`` in place (either may be None on ranks outside its mesh)."""
    src = home.local_state() if home is not None else {}
    out = shadow.local_state() if shadow is not None else None  # views of the live parameters
    with torch.no_grad():
        _, stats = mover.run(src, out=out, dtype=home.dtype if home is not None else dtype)
    return stats


def temporary_copy(mover: Reallocator, home: ParallelModel | None, cache: GroupCache,
                   dtype: torch.dtype = torch.float32, **kw) -> ParallelModel | None:
    """A new ParallelModel in the plan's destination placement with ``home``'s weights (None on ranks
    outside that mesh). ``kw`` goes to ParallelModel (e.g. value_head). Collective over the world:
    it creates the destination's process groups on first use."""
    plan = mover.plan
    src = home.local_state() if home is not None else {}
    with torch.no_grad():
        shards, _ = mover.run(src, dtype=home.dtype if home is not None else dtype)
    return ParallelModel.create(plan.dst.cfg, plan.dst.placement, cache, lambda name, _sl: shards[name],
                                value_head=plan.dst.value_head, **kw)
