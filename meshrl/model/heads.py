"""What a loss function sees of a model, and the micro-batch cut: shared by the one-process handle
(meshrl/algo/handles.py) and the multi-rank one (meshrl/parallel/model.py), so neither imports the
other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from ..errors import UserError


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
