"""Generation: log-probs equal a fresh forward, per-row seeded sampling, filters, EOS handling."""

from __future__ import annotations

import pytest
import torch

from meshrl.errors import UserError
from meshrl.model import ByteTokenizer, GenerationConfig, build_model, generate, sequence_logprobs
from meshrl.model.generation import filter_logits

TOK = ByteTokenizer()
PROMPTS = [TOK.encode(t) for t in ("Once upon a time", "hi", "The quick brown fox jumps", "a b c")]


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", seed=7)


def _sampling(**kw) -> GenerationConfig:
    base = dict(max_new_tokens=24, temperature=1.0, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
    return GenerationConfig(**{**base, **kw})


def _rows(out, i: int) -> list[int]:
    n = int(out.response_mask[i].sum())
    return out.responses[i, :n].tolist()


@pytest.mark.parametrize("greedy", [True, False])
def test_logprobs_equal_fresh_forward(model, greedy):
    cfg = _sampling(greedy=greedy, temperature=0.7, top_k=50)
    out = generate(model, PROMPTS, cfg, seeds=[1, 2, 3, 4])
    for i, prompt in enumerate(PROMPTS):
        resp = _rows(out, i)
        ids = torch.tensor([prompt + resp])
        fresh = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt) - 1:]
        assert torch.allclose(out.response_logprobs[i, :len(resp)], fresh, atol=1e-5), i
        assert out.response_logprobs.dtype == torch.float32


def test_logprobs_equal_padded_batch_forward(model):
    """The algorithms recompute log-probs on a right-padded [prompt | response] batch: same values."""
    out = generate(model, PROMPTS, _sampling(), seeds=[5, 6, 7, 8])
    seqs = [p + _rows(out, i) for i, p in enumerate(PROMPTS)]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [TOK.pad_token_id] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, mask)
    for i, p in enumerate(PROMPTS):
        n = len(seqs[i]) - len(p)
        assert torch.allclose(lp[i, len(p) - 1:len(p) - 1 + n], out.response_logprobs[i, :n], atol=1e-5)


def test_row_sampling_independent_of_batch(model):
    cfg = _sampling(top_p=0.9)
    full = generate(model, PROMPTS, cfg, seeds=[11, 12, 13, 14])
    again = generate(model, PROMPTS, cfg, seeds=[11, 12, 13, 14])
    assert torch.equal(full.responses, again.responses)
    for i in range(len(PROMPTS)):  # alone
        assert _rows(generate(model, [PROMPTS[i]], cfg, seeds=[11 + i]), 0) == _rows(full, i)
    order = [2, 0, 3, 1]  # another batch position, other neighbours
    shuffled = generate(model, [PROMPTS[j] for j in order], cfg, seeds=[11 + j for j in order])
    for pos, j in enumerate(order):
        assert _rows(shuffled, pos) == _rows(full, j)
    other_seed = generate(model, PROMPTS, cfg, seeds=[99, 12, 13, 14])
    assert _rows(other_seed, 0) != _rows(full, 0) and _rows(other_seed, 1) == _rows(full, 1)


def test_eos_stops_and_pads(model):
    # Greedy: declare a row's first token to be EOS. That row stops after one token; when every
    # row's first token is EOS (same prompt everywhere), the loop stops after one step.
    first = generate(model, PROMPTS, _sampling(greedy=True, eos_token_id=None)).responses
    eos = int(first[0, 0])
    out = generate(model, PROMPTS, _sampling(greedy=True, eos_token_id=eos))
    assert out.response_mask[0].tolist() == [1] + [0] * (out.responses.shape[1] - 1)
    assert out.responses[0, 1:].eq(TOK.pad_token_id).all() and out.responses.shape[1] > 1
    same = generate(model, [PROMPTS[0]] * 3, _sampling(greedy=True, eos_token_id=eos))
    assert same.responses.tolist() == [[eos]] * 3 and same.response_mask.tolist() == [[1]] * 3
    # Sampling with EOS: after a row's EOS, its tokens are pad, its mask and log-probs are 0.
    out = generate(model, PROMPTS, _sampling(max_new_tokens=64, temperature=3.0), seeds=[0, 1, 2, 3])
    for i in range(len(PROMPTS)):
        n = int(out.response_mask[i].sum())
        row = out.responses[i].tolist()
        if n < out.responses.shape[1]:
            assert row[n - 1] == TOK.eos_token_id
            assert set(row[n:]) == {TOK.pad_token_id} and (out.response_logprobs[i, n:] == 0).all()
        assert TOK.eos_token_id not in row[:n - 1]


def test_budget_and_shapes(model):
    out = generate(model, PROMPTS, _sampling(max_new_tokens=5, eos_token_id=None), seeds=[1, 2, 3, 4])
    assert out.responses.shape == out.response_logprobs.shape == out.response_mask.shape == (4, 5)
    assert out.responses.dtype == out.response_mask.dtype == torch.long
    assert (out.response_mask == 1).all() and (out.response_logprobs < 0).all()


def test_filters_keep_the_right_tokens():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 3.0, -1.0, -2.0]])
    top2 = filter_logits(logits, 2, 1.0)
    assert torch.isinf(top2).tolist() == [[True, True, False, False], [False, False, True, True]]
    p = logits.softmax(-1)  # row 0: [0.032, 0.087, 0.237, 0.644]
    nucleus = filter_logits(logits, 0, 0.8)
    assert torch.isfinite(nucleus[0]).tolist() == [False, False, True, True]
    tiny_p = filter_logits(logits, 0, 0.01)  # at least one token always survives
    assert torch.isfinite(tiny_p).sum(-1).tolist() == [1, 1]
    assert p.sum().item() == pytest.approx(2.0)


@pytest.mark.parametrize("bad,match", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=0.0), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k"),
])
def test_bad_generation_config(model, bad, match):
    with pytest.raises(UserError, match=match):
        generate(model, PROMPTS, _sampling(**bad))


def test_bad_prompts_and_seeds(model):
    with pytest.raises(UserError, match="at least one token"):
        generate(model, [[1, 2], []], _sampling())
    with pytest.raises(UserError, match="seeds"):
        generate(model, PROMPTS, _sampling(), seeds=[1])


def test_compaction_and_host_checks_change_nothing(model):
    """Finished rows dropped early (compaction at every check) or never, host checks every step or
    every 8: the same tokens, log-probs and masks. EOS is made frequent (the token this model samples
    most) so that rows end at different steps and the batch does shrink."""
    prompts = PROMPTS * 3
    seeds = list(range(100, 112))
    free = generate(model, prompts, _sampling(max_new_tokens=40, eos_token_id=None), seeds).responses
    base = _sampling(max_new_tokens=40, eos_token_id=int(free.flatten().mode().values))
    never = generate(model, prompts, GenerationConfig(**{**base.__dict__, "compact_below": 0.0}), seeds)
    lens = never.response_mask.sum(1)
    assert lens.min() < lens.max() and int((lens < 40).sum()) >= 6  # half end early: the batch shrinks
    for sync_every, below in ((1, 0.99), (8, 0.5), (3, 0.9)):
        cfg = GenerationConfig(**{**base.__dict__, "sync_every": sync_every, "compact_below": below})
        got = generate(model, prompts, cfg, seeds)
        assert torch.equal(got.responses, never.responses) and torch.equal(got.response_mask, never.response_mask)
        assert torch.allclose(got.response_logprobs, never.response_logprobs, atol=1e-5)


def test_compaction_shrinks_the_batch(model, monkeypatch):
    """The decode step really runs on fewer rows once most have ended (the point of compaction)."""
    import meshrl.model.generation as g
    sizes = []
    real = g.decode_one
    monkeypatch.setattr(g, "decode_one", lambda m, tok, *a: sizes.append(tok.shape[0]) or real(m, tok, *a))
    first = generate(model, PROMPTS, _sampling(greedy=True, eos_token_id=None, max_new_tokens=3)).responses
    eos = int(first[0, 0])  # rows with prompt 0 end after their first token
    prompts = [PROMPTS[0]] * 6 + [PROMPTS[1]] * 2
    sizes.clear()
    out = generate(model, prompts, _sampling(greedy=True, eos_token_id=eos, max_new_tokens=20, sync_every=2,
                                              compact_below=0.5, compile=False))  # the spy sees eager steps
    assert out.response_mask[:6].sum(1).tolist() == [1] * 6
    assert sizes[0] == 8 and sizes[-1] == 2
