"""Counter-based Gumbel-max sampling: the distribution it draws (against torch.multinomial), the
hash against a plain-Python version, and a row's independence of its batch."""

from __future__ import annotations

import pytest
import torch

from meshrl.model import sampling
from meshrl.model.sampling import filter_logits, first_argmax, gumbel, mix32, row_keys, sample_tokens, uniforms

N = 40_000  # draws per distribution: a 1% deviation in a 10% cell is ~3 sigma


def _prospector32(x: int) -> int:
    """The hash prospector's [16 21f0aaad 15 735a2d97 15] in plain Python integers (the oracle for
    the tensor version)."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def _p_value_chi2(counts: torch.Tensor, expected: torch.Tensor, dof: int) -> float:
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat.double() / 2))


def _homogeneity_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample chi-square test that counts a and b (same cells) come from one distribution."""
    keep = (a + b) > 0
    a, b = a[keep].double(), b[keep].double()
    total = a + b
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    stat = ((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum()
    return float(torch.special.gammaincc(torch.tensor((len(a) - 1) / 2.0, dtype=torch.float64), stat / 2))


def test_hash_equals_plain_python():
    xs = [0, 1, 2, 0xDEADBEEF, 0xFFFFFFFF, 12345678, 2**31, 2**31 - 1]
    got = mix32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [_prospector32(x) for x in xs]
    assert len(set(mix32(torch.arange(1 << 16)).tolist())) == 1 << 16  # a bijection: no collisions


def _int64_round(keys: torch.Tensor, step: int, vocab: int) -> torch.Tensor:
    return -torch.log(-torch.log(uniforms(keys, step, vocab)))


def test_the_int32_words_hash_as_mix32_does():
    xs = [0, 1, 2, 0xDEADBEEF, 0xFFFFFFFF, 12345678, 2**31, 2**31 - 1, 0x80000001]
    words = sampling._mix32_words(sampling._signed32(torch.tensor(xs, dtype=torch.int64)))
    assert words.dtype == torch.int32
    assert [w & 0xFFFFFFFF for w in words.tolist()] == [_prospector32(x) for x in xs]


@pytest.mark.parametrize("rows,vocab", [(1, 70_000), (5, 49_152), (33, 20_000), (2, 151_936)])
def test_the_cpu_noise_round_has_the_int64_rounds_bits(rows, vocab):
    """gumbel's int32 round on a CPU (NOISE_BLOCK elements at a time) against the int64 round over
    the whole batch, the one a GPU and torch.compile run: equal bits, so a row samples the same
    tokens on every device and under compile."""
    seeds = [0, 2**64 - 1, 2**63, 2**32 - 1, 12345, *range(7, 7 + rows)][:rows]
    keys = row_keys(seeds)
    assert rows * vocab > sampling.NOISE_SMALL  # the int32 round runs
    for step in (0, 1, 999, 2**20):
        assert torch.equal(gumbel(keys, step, vocab), _int64_round(keys, step, vocab))


def test_the_cpu_noise_round_over_many_blocks(monkeypatch):
    """Blocks of one row, of two rows with a remainder, and a vocabulary larger than a block."""
    monkeypatch.setattr(sampling, "NOISE_SMALL", 0)
    keys = row_keys(list(range(5)))
    for block in (700, 1500, 100):
        monkeypatch.setattr(sampling, "NOISE_BLOCK", block)
        assert torch.equal(gumbel(keys, 3, 700), _int64_round(keys, 3, 700))


@pytest.mark.parametrize("vocab", [257, 512, 49_152, 32_001])
def test_first_argmax_is_torch_argmax(vocab, monkeypatch):
    """Random rows, ties inside a block, across blocks and in a partial last block, infinities, a
    row of -inf only and a row holding NaN: the same index as torch.argmax (the first maximum)."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(9, vocab, generator=g)
    top = float(x.max()) + 1
    x[0, [3, 4]] = top  # a tie inside a block
    x[1, [5, vocab - 1]] = top  # across blocks, the second in the last (maybe partial) block
    x[2, [vocab - 2, vocab - 1]] = top  # both in the last block
    x[3, 7] = float("inf")
    x[4] = float("-inf")
    x[5, vocab // 2] = float("nan")
    x[6, : vocab // 3] = float("-inf")
    x[7] = 0.0  # every element a maximum
    monkeypatch.setattr(sampling, "ARGMAX_SMALL", 256)  # the blocks at every vocabulary here
    assert torch.equal(first_argmax(x), x.argmax(-1))
    for bf in (x.bfloat16(), x[:, : vocab - 1]):
        assert torch.equal(first_argmax(bf), bf.argmax(-1))


def test_uniforms_are_uniform_and_inside_the_unit_interval():
    u = uniforms(row_keys(list(range(64))), 5, 4096).flatten()
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    counts = torch.histc(u, bins=20, min=0.0, max=1.0)
    assert _p_value_chi2(counts.double(), torch.full((20,), u.numel() / 20, dtype=torch.float64), 19) > 1e-3


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 4, 1.0), (1.0, 0, 0.8),
                                                     (0.9, 5, 0.9)])
def test_draws_follow_softmax_like_torch_multinomial(temperature, top_k, top_p):
    """Many rows (distinct keys) over the same logits: our counts fit the filtered, tempered softmax
    and are indistinguishable from torch.multinomial's on the same probabilities."""
    logits = torch.log(torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.06, 0.04, 0.02, 0.01]))
    v = logits.numel()
    probs = filter_logits(logits[None] / temperature, top_k, top_p).softmax(-1)[0]
    ours = sample_tokens(logits.expand(N, v).contiguous(), row_keys(list(range(N))), 3, temperature, top_k, top_p)
    theirs = torch.multinomial(probs, N, replacement=True, generator=torch.Generator().manual_seed(0))
    c_ours, c_theirs = torch.bincount(ours, minlength=v).double(), torch.bincount(theirs, minlength=v).double()
    assert (c_ours[probs == 0] == 0).all()  # filtered tokens are never drawn
    support = probs > 0
    assert _p_value_chi2(c_ours[support], N * probs[support].double(), int(support.sum()) - 1) > 1e-3
    assert _homogeneity_p(c_ours, c_theirs) > 1e-3


def test_steps_of_one_row_are_independent_draws():
    """One key over many steps: again the right distribution, and consecutive draws uncorrelated."""
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    key = row_keys([2024])
    toks = torch.stack([sample_tokens(logits, key, s)[0] for s in range(8000)])
    counts = torch.bincount(toks, minlength=4).double()
    assert _p_value_chi2(counts, 8000 * torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64), 3) > 1e-3
    pairs = torch.bincount(toks[:-1] * 4 + toks[1:], minlength=16).double()  # transition table
    expected = 7999 * torch.outer(torch.tensor([0.5, 0.25, 0.125, 0.125]), torch.tensor([0.5, 0.25, 0.125, 0.125]))
    assert _p_value_chi2(pairs, expected.flatten().double(), 15) > 1e-3


def test_a_row_draws_the_same_alone_and_in_any_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=g)
    seeds = [7, 2**40 + 3, 0, 99, 5, 2**62 - 1]
    full = sample_tokens(logits, row_keys(seeds), 11, 0.8, 50, 0.95)
    for i in range(6):
        alone = sample_tokens(logits[i:i + 1], row_keys([seeds[i]]), 11, 0.8, 50, 0.95)
        assert int(alone) == int(full[i])
    perm = [3, 5, 0, 1, 4, 2]
    shuffled = sample_tokens(logits[perm], row_keys([seeds[j] for j in perm]), 11, 0.8, 50, 0.95)
    assert shuffled.tolist() == full[perm].tolist()
    other_step = sample_tokens(logits, row_keys(seeds), 12, 0.8, 50, 0.95)
    assert other_step.tolist() != full.tolist()  # fresh noise per step (6 rows all equal: ~never)


def test_greedy_is_argmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    assert sample_tokens(logits, None, 0).tolist() == logits.argmax(-1).tolist()
