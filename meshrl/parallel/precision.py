"""``train.dtype``: the parameter / activation / gradient dtype of a run (see ZeroAdamW for the fp32
master weights). ``auto`` is bfloat16 where the ranks compute on CUDA and float32 on a CPU.
``float64`` (CPU only) runs the whole pipeline in float64 — weights, activations, log-probs,
advantages, losses, AdamW's state and every collective — for the exact equality checks between
plans (meshrl/model/numerics.py)."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def torch_dtype(name: str, cuda: bool | None = None) -> torch.dtype:
    """``train.dtype`` -> a torch dtype; ``cuda`` (default: whether CUDA is available) decides auto."""
    if name == "auto":
        cuda = torch.cuda.is_available() if cuda is None else cuda
        return torch.bfloat16 if cuda else torch.float32
    return DTYPES[name]
