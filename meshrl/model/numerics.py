"""The precision of the figures a model's outputs turn into (log-probs, values, advantages, losses).

They are computed in float32 at least: a bf16 model's log-probs in float32, as every RL system does,
so that ratios of nearly equal probabilities keep their digits. A float64 model (``train.dtype=
float64``, CPU only) keeps float64 throughout, so that one process, every plan and every world size
can be compared to 1e-9 (the only differences left are the order of the sums).
"""

from __future__ import annotations

import torch


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype widens (or stays) to float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``, ``t`` itself when it is already there without calling into torch (a CPU
    decode step pays that dispatch per call)."""
    return t if t.dtype == dtype else t.to(dtype)


def wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in ``wide_dtype(t.dtype)`` (``t`` itself when it is already there)."""
    return cast(t, wide_dtype(t.dtype))
