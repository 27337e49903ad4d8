"""HF's LlamaRMSNorm, shared by the decoder layers and Qwen3's q / k norms."""

from __future__ import annotations

import torch
from torch import nn

from .numerics import cast, wide


class RMSNorm(nn.Module):
    """HF's LlamaRMSNorm: normalise in float32, cast back, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = wide(x)  # float32 (float64 stays float64)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * cast(x32, x.dtype)
