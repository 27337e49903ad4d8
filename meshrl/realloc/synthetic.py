"""Deterministic model weights defined element by element, so a rank can build any slice alone.

Element ``i`` (flat, row-major index in the full tensor) of parameter ``name`` is a 24-bit hash of
(i, name, seed) scaled to [-0.5, 0.5): exact in float32, and any rank computes the slice it holds
(or checks the slice it received) without the full tensor existing anywhere. Used by
``meshrl bench realloc`` on models too large to materialise once per rank, and by the tests.
"""

from __future__ import annotations

import zlib

import torch

from .shardmap import ShardMap, Slice

_MASK = (1 << 24) - 1


def synthetic(name: str, shape: tuple[int, ...], region: Slice, seed: int = 0,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``region`` of parameter ``name`` (full shape ``shape``): a tensor of the region's shape."""
    sizes = tuple(b - a for a, b in region)
    idx = torch.zeros(sizes, dtype=torch.int64)
    stride = 1
    for d in reversed(range(len(shape))):
        view = [1] * len(shape)
        view[d] = sizes[d]
        idx += torch.arange(region[d][0], region[d][1], dtype=torch.int64).view(view) * stride
        stride *= shape[d]
    salt = zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)
    # Multiply-xorshift hash, kept within 62 bits so int64 never overflows.
    h = (idx * 40503 + salt) & 0x3FFFFFFFFFFF
    h = ((h ^ (h >> 13)) * 2654435761) & 0x3FFFFFFFFFFF
    vals = ((h >> 7) & _MASK).to(torch.float32) / (1 << 24) - 0.5
    return vals.to(dtype)


def synthetic_shards(sm: ShardMap, rank: int, seed: int = 0, dtype: torch.dtype = torch.float32,
                     ) -> dict[str, torch.Tensor]:
    """Every shard ``rank`` holds under ``sm``, built from the synthetic weights."""
    return {n: synthetic(n, sm.shapes[n], s, seed, dtype) for n, s in sm.params_of(rank).items()}


def cut_shards(full: dict[str, torch.Tensor], sm: ShardMap, rank: int) -> dict[str, torch.Tensor]:
    """The shards ``rank`` holds under ``sm``, cut (and copied) from full tensors ``{name: tensor}``."""
    return {n: full[n][tuple(slice(a, b) for a, b in s)].clone() for n, s in sm.params_of(rank).items()}
