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

The hash is a two-round xor-shift-multiply bijection on 32-bit words from Chris Wellons' hash
prospector (``[16 21f0aaad 15 735a2d97 15]``, bias 0.108, lower than MurmurHash3's finaliser). Its
multipliers are below 2**31, so on int64 tensors holding 32-bit words every product is exact (no
overflow, the same bits on every device and under torch.compile). The row key and the step are
hashed into one word per row, each token index into one word per column, and a last round over
their xor gives the [B, V] words: one hash round per element, the rest is per row or per column.
``U`` has 23 random bits, ``(h >> 9 + 0.5) / 2**23``, strictly inside (0, 1) in float32 (24 bits
would round the largest value up to 1.0): Gumbel noise is then finite, at most about 16.6.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # odd constant that separates the step and column streams


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit bijective hash of 32-bit words held in int64 tensors (any shape); products < 2**63."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


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
    h = mix32(rowstep[:, None] ^ cols[None, :])
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


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
