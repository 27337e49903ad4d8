"""What every call gets besides its role's model handle (meshrl/algo/handles.py): the batch and a
context; and the keyed randomness, the optimizer and the stat sums the calls share.

Calls share no hidden state: a call sees only its own role and the batch keys it declared, so a
runtime can run it on its own ranks. Randomness is keyed by data, never by process:
sampling by (seed, iteration, prompt index, sample index), shuffling by (seed, iteration, epoch).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import Config


def key_seed(*parts: object) -> int:
    """A 63-bit seed from a tuple of keys (stable across processes and Python versions)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def keyed_generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(key_seed(*parts))


@dataclass
class Role:
    """A role's model, and its optimizer when some call trains it. ``model`` None = a rule reward."""

    model: nn.Module | None
    optim: torch.optim.Optimizer | None = None


@dataclass
class CallContext:
    """Read-only facts a call may use: the config, the iteration, the tokenizer."""

    cfg: Config
    iteration: int
    tokenizer: object
    algo: str = field(default="")

    def __post_init__(self) -> None:
        self.algo = self.algo or self.cfg.algo


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay,
                             eps=1e-8)


def minibatch_rows(n_rows: int, n_mini: int, *key: object) -> list[torch.Tensor]:
    """A permutation of the rows keyed by ``key``, cut into ``n_mini`` nearly equal mini-batches."""
    if n_mini > n_rows:
        n_mini = n_rows
    perm = torch.randperm(n_rows, generator=keyed_generator(*key))
    return list(perm.tensor_split(n_mini))


class StatSum:
    """Named running sums. Loss terms are already divided by the whole mini-batch's count, so the
    sum over a mini-batch's micro-batches is that mini-batch's value."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def add(self, name: str, value: float | torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(value)
