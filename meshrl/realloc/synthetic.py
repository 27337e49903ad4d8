"""Deterministic model weights defined element by element, so a rank can build any slice alone.

Element ``i`` (flat, row-major index in the full tensor) of parameter ``name`` is a 24-bit hash of
(i, name, seed) scaled to [-0.5, 0.5): exact in float32, and any rank computes the slice it holds
(or checks the slice it received) without the full tensor existing anywhere. Used by
``meshrl bench realloc`` on models too large to materialise once per rank, and by the tests.
"""

from __future__ import annotations

import zlib

import torch

from ..layout.shardmap import ShardMap, Slice

_MASK = (1 << 24) - 1
_MASK46 = 0x3FFFFFFFFFFF


def synthetic(name: str, shape: tuple[int, ...], region: Slice, seed: int = 0,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``region`` of parameter ``name`` (full shape ``shape``): a tensor of the region's shape.

    In place on one int64 buffer (plus one for the shifted copy): a 100M-element shard is 800 MB
    per int64 temporary, and each new temporary costs its page faults."""
    sizes = tuple(b - a for a, b in region)
    h = torch.zeros(sizes, dtype=torch.int64)  # becomes the flat index, then its hash
    stride = 1
    for d in reversed(range(len(shape))):
        view = [1] * len(shape)
        view[d] = sizes[d]
        h += torch.arange(region[d][0], region[d][1], dtype=torch.int64).view(view) * stride
        stride *= shape[d]
    salt = zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)
    # Multiply-xorshift hash on 46-bit values; the product may wrap int64, and only its low 46 bits
    # are kept, which wrapping does not change.
    h.mul_(40503).add_(salt).bitwise_and_(_MASK46)
    h.bitwise_xor_(torch.bitwise_right_shift(h, 13))
    h.mul_(2654435761).bitwise_and_(_MASK46)
    vals = h.bitwise_right_shift_(7).bitwise_and_(_MASK).to(torch.float32)
    return vals.div_(1 << 24).sub_(0.5).to(dtype)


def synthetic_shards(sm: ShardMap, rank: int, seed: int = 0, dtype: torch.dtype = torch.float32,
                     ) -> dict[str, torch.Tensor]:
    """Every shard ``rank`` holds under ``sm``, built from the synthetic weights."""
    return {n: synthetic(n, sm.shapes[n], s, seed, dtype) for n, s in sm.params_of(rank).items()}


def cut_shards(full: dict[str, torch.Tensor], sm: ShardMap, rank: int) -> dict[str, torch.Tensor]:
    """The shards ``rank`` holds under ``sm``, cut (and copied) from full tensors ``{name: tensor}``."""
    return {n: full[n][tuple(slice(a, b) for a, b in s)].clone() for n, s in sm.params_of(rank).items()}
