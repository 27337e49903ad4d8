"""Which function runs a call of an algorithm's graph: the RL calls (meshrl/algo/calls.py) or the
calls on fixed data (calls_offline.py), looked up in one place that imports both."""

from __future__ import annotations

from collections.abc import Callable

from .calls import ROW_CALLS, TRAIN_CALLS
from .calls_offline import OFFLINE_CALLS
from .graph import Call


def implementation(call: Call, algo: str) -> Callable:
    """The function that runs ``call`` of ``algo``'s graph: ``fn(handle, batch, ctx, place)``, which
    returns the replica's output rows (row-wise calls) or the call's statistics (train calls)."""
    if algo in OFFLINE_CALLS:
        return OFFLINE_CALLS[algo][call.name]
    return ROW_CALLS.get(call.name) or TRAIN_CALLS[call.name]
