"""Partial rollouts (meshrl/algo/partial.py) against independent oracles: a row continued under
unchanged weights samples the uninterrupted generation's tokens; under new weights its first
tokens are the old model's and every token's log-prob is that of the model of its version, as a
fresh forward pass of that model computes it; the staleness figures by hand."""

from __future__ import annotations

import pytest
import torch

from meshrl.algo import setup
from meshrl.algo.calls import Place, generate_rows
from meshrl.algo.common import CallContext
from meshrl.algo.handles import LocalHandle
from meshrl.algo.iteration import rollout_batch
from meshrl.algo.partial import continue_rows, staleness
from meshrl.config import load_config
from meshrl.model import build_model, sequence_logprobs

N, S = 8, 3


@pytest.fixture(scope="module")
def run():
    cfg = load_config(None, [f"data.gen_len={N}", "data.batch_size=4", "train.dtype=float64", "gen.temperature=1.5"])
    tok = setup.tokenizer_for(cfg)
    prompts = rollout_batch(setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg)), cfg, 0)
    a = build_model("tiny", seed=3, dtype=torch.float64)
    b = build_model("tiny", seed=4, dtype=torch.float64)
    return cfg, tok, prompts.only(["prompt_ids", "prompt_mask", "sample_seed"]), a, b


def _two_segments(run, second):
    cfg, tok, part, a, _ = run
    ctx = CallContext(cfg, 0, tok)
    half = continue_rows(LocalHandle(a), part, None, ctx, 1, 0, S, version=5, at_bound=False)
    return half, continue_rows(LocalHandle(second), part, half, ctx, 1, S, N - S, version=6, at_bound=True)


def test_a_row_continued_under_the_same_weights_samples_the_uninterrupted_tokens(run):
    cfg, tok, part, a, _ = run
    whole = generate_rows(LocalHandle(a), part, CallContext(cfg, 0, tok), Place())
    half, done = _two_segments(run, a)
    assert int(half["gen_live"].sum()) > 0  # some rows were in flight at the interruption
    assert torch.equal(done["input_ids"], whole["input_ids"])
    assert torch.equal(done["response_mask"], whole["response_mask"])
    assert torch.equal(done["attention_mask"], whole["attention_mask"])
    assert torch.allclose(done["logp_old"], whole["logp_old"], atol=1e-12, rtol=0)  # re-prefill vs cached decode
    assert int(done["gen_live"].sum()) == 0
    assert torch.equal(done["gen_bound"], half["gen_live"])  # in flight at the bound: finished there


def test_new_weights_take_over_and_each_token_keeps_its_versions_log_prob(run):
    cfg, tok, part, a, b = run
    whole_a = generate_rows(LocalHandle(a), part, CallContext(cfg, 0, tok), Place())
    half, done = _two_segments(run, b)
    p = part["prompt_ids"].shape[1]
    mask = done["response_mask"]
    first = mask[:, :S].bool()
    assert torch.equal(done["input_ids"][:, p:p + S][first], whole_a["input_ids"][:, p:p + S][first])
    assert torch.equal(done["token_version"], torch.cat([torch.full((len(part), S), 5),
                                                         torch.full((len(part), N - S), 6)], 1) * mask)
    assert mask[:, S:].sum() > 0 and not torch.equal(done["input_ids"], whole_a["input_ids"])
    ids, am = done["input_ids"], done["attention_mask"]
    for model, cols in ((a, slice(0, S)), (b, slice(S, N))):  # each version's own fresh forward
        fresh = sequence_logprobs(model, ids, am)[:, p - 1:] * mask
        assert torch.allclose(done["logp_old"][:, cols], fresh[:, cols], atol=1e-10, rtol=0)


def test_staleness_by_hand():
    """Consumer version 5; row 0: versions 3, 3, 4 (+ padding), in flight at the bound; row 1: 4, 4, 4, 4.
    Lags 2, 2, 1, 1, 1, 1, 1: mean 9/7, max 2; row 0 interrupted (two versions): 1/2; at bound 1/2."""
    version = torch.tensor([[3, 3, 4, 0], [4, 4, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    got = staleness(version, mask, torch.tensor([1, 0]), 5)
    assert got == {"rollout/staleness_mean": pytest.approx(9 / 7), "rollout/staleness_max": 2.0,
                   "rollout/interrupted": 0.5, "rollout/at_bound": 0.5}
