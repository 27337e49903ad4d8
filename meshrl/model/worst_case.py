"""The worst-case switch: where the code branches on data, take the branch that costs the most.

``meshrl plan --dry-run`` (meshrl/runtime/dry_run.py) executes the real runtime on fake tensors,
which have shapes but no values, so a data-dependent branch cannot be decided from the data. Under
``worst_case()`` each such branch takes its memory worst case instead, which is also what a
pre-flight check wants to see:

- generation: every row runs to ``max_new_tokens`` (no EOS check, no compaction of finished rows,
  the output as wide as the budget) (model/generation.py, parallel/generate_micro.py);
- padding: no column or token is trimmed as padding (model/heads.real_columns,
  model/batch_layout.Unpad.of);
- MoE routing: every token's k picks land on this rank's experts, as unevenly as the router
  allows: min(k, experts held) of them receive every token of the batch (the most one expert can
  get), the others none (model/moe.ExpertList).

With ``decode="ends"`` a decoding loop runs only its first two and last two steps
(``decode_steps``): every step of the worst case has the same shapes but a context one token
longer, so the last ones hold the most and the skipped ones issue the same collectives; pipelined
decoding runs the decoding passes of its first two micro-batches (``repeated_steps``: every one is
prefilled, its caches made and held; the others' passes would have the same shapes, one row
smaller at most); and a train call runs the first two of its optimizer steps (``repeated_steps``:
every mini-batch of the worst case has the same rows and lengths), each through the micro-batches
1F1B needs to reach its most in flight (``pipelined_micro_batches``). This keeps a full-size dry
run to minutes. ``decode="all"`` runs every step.

The dry run of a GPU cluster executes fake *CPU* tensors (fake CUDA tensors need a CUDA build);
``device_type(t)`` gives the branches that differ by device the device being simulated ("cuda"),
so a CPU-only path (fused decoding projections, float32 attention for bf16) is not taken for it.

Off by default; nothing else reads it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch

_ON = {"on": False, "decode": "all", "device": None}
DECODE = ("all", "ends")


def active() -> bool:
    """Whether data-dependent branches take their worst case (a dry run is executing)."""
    return _ON["on"]


def decode_steps(n: int, start: int = 0) -> Iterable[int]:
    """The steps start..n-1 of a decoding loop to run: all of them, or under ``decode="ends"``
    the first two and the last two."""
    if not _ON["on"] or _ON["decode"] == "all":
        return range(start, n)
    return sorted({s for s in (start, start + 1, n - 2, n - 1) if start <= s < n})


def repeated_steps(n: int) -> Iterable[int]:
    """The steps to run of a loop of ``n`` steps that the worst case makes alike (a train call's
    optimizer steps: equal mini-batches of full-length rows; pipelined decoding's micro-batches,
    each prefilled, its caches held): all of them, or under ``decode="ends"`` the first two
    (the first makes any state the later ones reuse, the second stands for every later one: same
    shapes, same collectives)."""
    if not _ON["on"] or _ON["decode"] == "all":
        return range(n)
    return range(min(n, 2))


def pipelined_micro_batches(n: int, pp: int) -> int:
    """How many of a train call's ``n`` micro-batches to run through its ``pp`` pipeline stages (1F1B):
    all of them, or under ``decode="ends"`` at most max(pp, 2). The worst case makes them alike, and
    1F1B holds at most pp - stage of them in flight, which pp micro-batches already reach; the
    gradients, their reduction at the last backward and the optimizer step are the same for any
    number."""
    if not _ON["on"] or _ON["decode"] == "all":
        return n
    return min(n, max(pp, 2))


def device_type(t: torch.Tensor) -> str:
    """The type of the device ``t`` stands for: its own, or the one a dry run simulates."""
    return _ON["device"] or t.device.type


@contextmanager
def worst_case(decode: str = "all", device: str | None = None) -> Iterator[None]:
    """Turn the switch on for the block (one flag for the process, which every thread sees);
    ``device``: the device type the run simulates (None: the tensors' own)."""
    if decode not in DECODE:
        raise ValueError(f"decode must be one of {DECODE}, got {decode!r}")
    before = dict(_ON)
    _ON.update(on=True, decode=decode, device=device)
    try:
        yield
    finally:
        _ON.update(before)
