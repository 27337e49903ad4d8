"""Batch-invariant sampling in one tensor operation: Gumbel-max over counter-based noise.

A sampled token is ``argmax_v (logits[v] / T + G[v])`` over the tokens that survive top-k/top-p,
where ``G[v] = -log(-log(U[v]))`` is standard Gumbel noise. By the Gumbel-max theorem this draws v
with probability ``softmax(filtered logits / T)[v]`` (what ``torch.multinomial`` draws from; the
test checks it statistically). ``U[v]`` is not taken from a stateful generator but *computed* from
the counter ``(row key, step, v)`` by an integer hash, so

- every row of a batch gets its noise in one vectorised operation (no per-row loop);
- a row's noise depends on its key and its step only: the row samples the same tokens in any
  batch, at any batch position, after any compaction and under any plan (every rank that computes
  it computes the same bits, on any device: the hash is exact integer arithmetic);
- there is no generator state to carry between steps or ranks, and the step is a tensor, so the
  decode step keeps the same shapes (and one compiled graph) at every step.

The hash is Chris Wellons' ``lowbias32`` (two xor-shift-multiply rounds, a bijection on 32-bit
words with low avalanche bias), applied to the row key, the step and the column and combined by a
further round. Integer arithmetic is done on int64 tensors holding 32-bit words, with 32 x 32-bit
products split in 16-bit halves so that nothing overflows int64. ``U`` has 24 random bits,
``(h >> 8 + 0.5) / 2**24``, strictly inside (0, 1): Gumbel noise is then finite, at most about 17.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # odd constant that separates the step and column streams


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit words x (int64) and a 32-bit constant c, without overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32: a 32-bit bijective hash of 32-bit words held in int64 tensors (any shape)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seeds: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """Python ints (any size; taken mod 2**64) -> keys [B] int64, 32-bit words hashing both halves."""
    lo = torch.tensor([s & _M32 for s in seeds], dtype=torch.int64, device=device)
    hi = torch.tensor([(s >> 32) & _M32 for s in seeds], dtype=torch.int64, device=device)
    return mix32(mix32(lo) ^ hi)


def uniforms(keys: torch.Tensor, step: torch.Tensor | int, vocab: int) -> torch.Tensor:
    """keys [B] int64, step (0-dim int64 tensor or int) -> U [B, vocab] float32 in (0, 1)."""
    step = torch.as_tensor(step, dtype=torch.int64, device=keys.device)
    rowstep = mix32(keys ^ mix32((step * _GOLDEN + 1) & _M32))  # [B]
    cols = mix32(torch.arange(vocab, dtype=torch.int64, device=keys.device) ^ _GOLDEN)  # [V]
    h = mix32(mix32(rowstep[:, None] ^ cols[None, :]) ^ rowstep[:, None])
    return ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))


def gumbel(keys: torch.Tensor, step: torch.Tensor | int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [B, vocab] float32 for (row key, step, column)."""
    return -torch.log(-torch.log(uniforms(keys, step, vocab)))


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [B, V] -> the same with tokens outside top-k / the top-p nucleus set to -inf.
    Top-p keeps the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, keys: torch.Tensor | None, step: torch.Tensor | int,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [B, V] float32 -> tokens [B] long. ``keys`` None means greedy (argmax).

    Draws from softmax(filter(logits / temperature)) by Gumbel-max with the counter noise of
    (keys[i], step, v): row i's token is a function of its own logits, key and step only."""
    if keys is None:
        return logits.argmax(-1)
    scores = filter_logits(logits / temperature, top_k, top_p)
    return (scores + gumbel(keys, step, logits.shape[-1])).argmax(-1)
