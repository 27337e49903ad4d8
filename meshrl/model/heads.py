"""What a loss function sees of a model, and the micro-batch cut: shared by the one-process handle
(meshrl/algo/handles.py) and the multi-rank one (meshrl/parallel/model.py), so neither imports the
other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from ..errors import UserError
from . import worst_case


@dataclass
class HeadOutputs:
    """What a loss function sees for one micro-batch of b rows and S tokens (last stage only).

    logprobs [b, S-1]: log p(token t+1 | tokens <= t), float32 (language models);
    entropy [b, S-1] or None (when asked for); values [b, S] (value models)."""

    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


Batch = Mapping[str, torch.Tensor]  # at least input_ids and attention_mask [B, S]; all split on dim 0
LossFn = Callable[[HeadOutputs, Batch], torch.Tensor]


def split_micro(batch: Batch, n: int) -> list[dict[str, torch.Tensor]]:
    """Cut every tensor of ``batch`` into ``n`` near-equal row blocks -> n micro-batches."""
    rows = batch["input_ids"].shape[0]
    if not 1 <= n <= rows:
        raise UserError(f"cannot split {rows} rows into {n} micro-batches")
    parts = {k: torch.tensor_split(v, n, dim=0) for k, v in batch.items()}
    return [{k: parts[k][i] for k in batch} for i in range(n)]


def real_columns(attention_mask: torch.Tensor) -> tuple[int, int]:
    """[b, S] mask -> (lo, hi): the columns lo..hi-1 hold a real token in some row. Compute follows
    real tokens, not the run's fixed P + N: pad keys are masked and positions count real tokens
    only, so running the model on these columns changes no real token's output."""
    if worst_case.active():  # a dry run: every column counts as real
        return 0, attention_mask.shape[1]
    cols = attention_mask.bool().any(0).nonzero()
    return (int(cols[0]), int(cols[-1]) + 1) if len(cols) else (0, attention_mask.shape[1])


def trim_columns(mb: Batch) -> tuple[dict[str, torch.Tensor], int]:
    """The model inputs (input_ids, attention_mask) [b, S] cut to their real columns, and lo."""
    lo, hi = real_columns(mb["attention_mask"])
    return {"input_ids": mb["input_ids"][:, lo:hi], "attention_mask": mb["attention_mask"][:, lo:hi]}, lo


def pad_columns(x: torch.Tensor | None, lo: int, width: int) -> torch.Tensor | None:
    """[b, w, ...] columns lo..lo+w-1 of a [b, width, ...] tensor that is 0 elsewhere."""
    if x is None or (lo == 0 and x.shape[1] == width):
        return x
    tail = [0, 0] * (x.dim() - 2)
    return torch.nn.functional.pad(x, (*tail, lo, width - lo - x.shape[1]))


def pad_head(out: HeadOutputs, lo: int, width: int) -> HeadOutputs:
    """A trimmed micro-batch's outputs back at full width S (log-probs and entropy S-1, values S)."""
    return HeadOutputs(logprobs=pad_columns(out.logprobs, lo, width - 1),
                       entropy=pad_columns(out.entropy, lo, width - 1), values=pad_columns(out.values, lo, width))
