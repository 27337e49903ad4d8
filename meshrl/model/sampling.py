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

from . import worst_case

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


def _words(keys: torch.Tensor, step: torch.Tensor | int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-row words [B] (row key and step hashed) and per-column words [V] (token index hashed),
    int64 holding 32-bit values; their xor, hashed once more, is the [B, V] words."""
    step = torch.as_tensor(step, dtype=torch.int64, device=keys.device)
    rowstep = mix32(keys ^ mix32((step * _GOLDEN + 1) & _M32))  # [B]
    cols = mix32(torch.arange(vocab, dtype=torch.int64, device=keys.device) ^ _GOLDEN)  # [V]
    return rowstep, cols


def uniforms(keys: torch.Tensor, step: torch.Tensor | int, vocab: int) -> torch.Tensor:
    """keys [B] int64, step (0-dim int64 tensor or int) -> U [B, vocab] float32 in (0, 1)."""
    rowstep, cols = _words(keys, step, vocab)
    h = mix32(rowstep[:, None] ^ cols[None, :])
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


# The [B, V] round on a CPU: int32 words (two's complement), in blocks of rows of about this many
# elements, which stay in a core's cache through the round's ~20 element-wise passes. The int64
# round over the whole batch reads and writes twice the bytes, from memory: at 32 rows of a
# 151,936-token vocabulary (Qwen's) it costs more than a decode step's matmuls
# (bench/sampling_noise.py).
NOISE_BLOCK = 1 << 18
# Below this many elements the int64 round in one pass is the quicker (fewer kernels; it fits a cache).
NOISE_SMALL = 1 << 16


def _signed32(x: torch.Tensor) -> torch.Tensor:
    """32-bit values held in int64 -> the same bits as int32."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


def _shr32(x: torch.Tensor, s: int) -> torch.Tensor:
    """The logical right shift of int32 words by s (torch's >> on int32 is arithmetic; the
    sign-filled top bits are cleared)."""
    return (x >> s) & ((1 << (32 - s)) - 1)


def _mix32_words(x: torch.Tensor) -> torch.Tensor:
    """``mix32`` on int32 words, in place: the same bits. A product of int32 words wraps to its low
    32 bits, which are what mix32's ``& _M32`` keeps; the shifts are logical (``_shr32``)."""
    x ^= _shr32(x, 16)
    x *= 0x21F0AAAD
    x ^= _shr32(x, 15)
    x *= 0x735A2D97
    x ^= _shr32(x, 15)
    return x


def _eager_cpu(t: torch.Tensor) -> bool:
    """Whether ``t``'s kernels run one by one on a CPU (not a GPU, not inside torch.compile), where
    the blocked paths below pay."""
    return worst_case.device_type(t) == "cpu" and not torch.compiler.is_compiling()


def gumbel_int64(keys: torch.Tensor, step: torch.Tensor | int, vocab: int) -> torch.Tensor:
    """``gumbel`` by the int64 round over the whole batch (``uniforms``)."""
    return -torch.log(-torch.log(uniforms(keys, step, vocab)))


def gumbel(keys: torch.Tensor, step: torch.Tensor | int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [B, vocab] float32 for (row key, step, column): -log(-log(U)).
    Eager on a CPU the [B, V] round runs on int32 words, NOISE_BLOCK elements at a time; elsewhere,
    under torch.compile (which fuses the round) and for at most NOISE_SMALL elements, it is
    ``gumbel_int64``. The same bits either way (tests/model/test_sampling.py)."""
    if not _eager_cpu(keys) or keys.shape[0] * vocab <= NOISE_SMALL:
        return gumbel_int64(keys, step, vocab)
    rowstep, cols = (_signed32(w) for w in _words(keys, step, vocab))
    out = torch.empty(keys.shape[0], vocab, dtype=torch.float32, device=keys.device)
    rows = max(1, NOISE_BLOCK // vocab)
    for i in range(0, keys.shape[0], rows):
        h = _mix32_words(rowstep[i:i + rows, None] ^ cols[None, :])
        u = _shr32(h, 9).float().add_(0.5).mul_(1.0 / (1 << 23))  # as uniforms: the top 23 bits, centred
        torch.log(u, out=out[i:i + rows]).neg_().log_().neg_()
    return out


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


# first_argmax's blocks: a row's maximum is found as the maximum of its blocks' maxima (amax, which
# a CPU vectorises), then its first index inside the first block that holds it. torch.argmax on a
# CPU reduces index and value together, element by element: several times amax's time over a
# vocabulary (bench/sampling_noise.py).
ARGMAX_BLOCK = 256
ARGMAX_SMALL = 1 << 13  # up to this vocabulary torch.argmax is the quicker (fewer kernels)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """x [B, V] float -> the index of each row's first maximum [B] long: torch.argmax's answer
    (ties to the first index; a batch holding NaN goes to torch.argmax, which takes NaN as the
    maximum). Eager on a CPU over V > ARGMAX_SMALL it runs by blocks; elsewhere (and in a dry run,
    which cannot read its fake tensors' values) it is torch.argmax."""
    b, v = x.shape
    if not _eager_cpu(x) or worst_case.active() or v <= ARGMAX_SMALL:
        return x.argmax(-1)
    whole = v // ARGMAX_BLOCK * ARGMAX_BLOCK
    block_max = x[:, :whole].view(b, -1, ARGMAX_BLOCK).amax(-1)
    if whole < v:
        block_max = torch.cat([block_max, x[:, whole:].amax(-1, keepdim=True)], 1)
    m = block_max.amax(-1, keepdim=True)
    if bool(m.isnan().any()):
        return x.argmax(-1)
    start = (block_max == m).to(torch.uint8).argmax(-1) * ARGMAX_BLOCK  # the first block holding it
    cols = (start[:, None] + torch.arange(ARGMAX_BLOCK, device=x.device)).clamp_(max=v - 1)
    return start + (x.gather(1, cols) == m).to(torch.uint8).argmax(-1)


def sample_tokens(logits: torch.Tensor, keys: torch.Tensor | None, step: torch.Tensor | int,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [B, V] float32 -> tokens [B] long. ``keys`` None means greedy (argmax).

    Draws from softmax(filter(logits / temperature)) by Gumbel-max with the counter noise of
    (keys[i], step, v): row i's token is a function of its own logits, key and step only."""
    if keys is None:
        return first_argmax(logits)
    # x / 1.0 is x: no pass over [B, V] for the default temperature
    scores = filter_logits(logits if temperature == 1.0 else logits / temperature, top_k, top_p)
    return first_argmax(scores + gumbel(keys, step, logits.shape[-1]))
