"""What a batch's prompts share is prefilled once (meshrl/model/generation.py ``PromptBatch``): a prompt
repeated by several rows (GRPO's n samples of one prompt), and a prefix every prompt starts with (a chat
template's system prompt). Either way every row decodes what it decodes when prefilled in full:
repeated prompts to the bit (eager packed float32), a shared prefix to rounding, with the very
tokens, and log-probs equal to a fresh forward of [prompt | response]. Under tensor and pipeline
layouts: tests/parallel/test_layouts.py."""

from __future__ import annotations

import torch

import meshrl.model.generation as generation
from meshrl.model import worst_case
from meshrl.model.checkpoint import build_model
from meshrl.model.generation import GenerationConfig, generate, sequence_logprobs
from meshrl.model.prompt_batch import SHARED_PREFIX_MIN, PromptBatch, distinct_prompts, shared_prefix

PROMPTS = [[5, 6, 7], [8, 9], [5, 6, 7], [10, 11, 12, 13], [8, 9], [5, 6, 7], [14], [5, 6, 7]]
SYSTEM = list(range(30, 30 + SHARED_PREFIX_MIN + 4))  # a system prompt every chat prompt starts with
CHAT = [SYSTEM + [50 + i] * (1 + i % 4) for i in range(5)] + [SYSTEM + [50, 50]] * 2 + [SYSTEM + [51, 60]]


def test_distinct_prompts_in_first_seen_order_with_each_rows_index():
    distinct, repeat = distinct_prompts(PROMPTS)
    assert distinct == [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    assert repeat == [0, 1, 0, 2, 1, 0, 3, 0]
    assert [distinct[r] for r in repeat] == PROMPTS
    assert distinct_prompts([[1], [2, 3]]) == ([[1], [2, 3]], None)  # nothing repeats: as given


def test_the_shared_prefix_leaves_every_prompt_a_token_and_short_ones_are_not_shared():
    assert shared_prefix(CHAT) == len(SYSTEM) + 0  # [50] vs [51, 51]: the system prompt only
    assert shared_prefix([SYSTEM + [1], SYSTEM + [1, 2]]) == len(SYSTEM)  # the shorter keeps its last token
    assert shared_prefix([SYSTEM, SYSTEM + [1, 2]]) == len(SYSTEM) - 1
    assert shared_prefix([SYSTEM[:SHARED_PREFIX_MIN - 1] + [1], SYSTEM[:SHARED_PREFIX_MIN - 1] + [2]]) == 0
    assert shared_prefix([SYSTEM + [1]]) == 0
    assert shared_prefix(CHAT, sliding_window=64) == 0  # a sliding window counts slots: not there


def test_the_batch_layout_puts_the_prefix_first_and_pads_the_remainders():
    batch = PromptBatch.of(CHAT, 0, torch.device("cpu"))
    n = len(SYSTEM)
    assert batch.shared == n and batch.cache_rows == 1 and batch.ids.shape == (7, max(map(len, CHAT)))
    assert batch.repeat == [0, 1, 2, 3, 4, 5, 5, 6]
    for row, prompt in zip(batch.ids.tolist(), [CHAT[i] for i in (0, 1, 2, 3, 4, 5, 7)], strict=True):
        assert row[:n] == SYSTEM and row[-(len(prompt) - n):] == prompt[n:]
    assert batch.mask.sum(1).tolist() == [len(CHAT[i]) for i in (0, 1, 2, 3, 4, 5, 7)]
    plain = PromptBatch.of(CHAT, 0, torch.device("cpu"), share=False)
    assert plain.shared == 0 and plain.repeat is None and plain.cache_rows == len(CHAT)


def test_a_dry_runs_worst_case_prefills_every_row():
    with worst_case.worst_case():
        assert distinct_prompts(PROMPTS) == (PROMPTS, None) and shared_prefix(CHAT) == 0


def _in_full(monkeypatch, fn):
    """``fn()`` with every row prefilled in full (nothing shared)."""
    real = generation.PromptBatch.of
    monkeypatch.setattr(generation.PromptBatch, "of", lambda *a, **k: real(*a, **{**k, "share": False}))
    out = fn()
    monkeypatch.undo()
    return out


# The compiled step takes the same path (decode_loop's prefill_prompts); MESHRL_GEN_COMPILE=1 runs these under it.
def test_repeated_prompts_decode_as_if_each_row_were_prefilled(monkeypatch):
    model = build_model("tiny", seed=0)
    cfg = GenerationConfig(max_new_tokens=6, temperature=1.0, eos_token_id=3, pad_token_id=0)
    seeds = list(range(100, 100 + len(PROMPTS)))
    shared = generate(model, PROMPTS, cfg, seeds)
    full = _in_full(monkeypatch, lambda: generate(model, PROMPTS, cfg, seeds))
    assert torch.equal(shared.responses, full.responses) and torch.equal(shared.response_mask, full.response_mask)
    if cfg.use_compile:
        assert torch.allclose(shared.response_logprobs, full.response_logprobs, atol=1e-6)
    else:  # packed matmuls give a row the same bits in any batch
        assert torch.equal(shared.response_logprobs, full.response_logprobs)
    # rows of one prompt sampled with different seeds: they are not copies of each other
    assert not all(torch.equal(shared.responses[0], shared.responses[i]) for i in (2, 5, 7))


def test_a_shared_prefix_decodes_the_tokens_of_a_full_prefill(monkeypatch):
    model = build_model("tiny", seed=0)
    seeds = list(range(200, 200 + len(CHAT)))
    for cfg in (GenerationConfig(max_new_tokens=8, greedy=True, pad_token_id=0),
                GenerationConfig(max_new_tokens=8, temperature=0.9, top_k=40, eos_token_id=3, pad_token_id=0)):
        shared = generate(model, CHAT, cfg, seeds)
        full = _in_full(monkeypatch, lambda cfg=cfg: generate(model, CHAT, cfg, seeds))
        assert torch.equal(shared.responses, full.responses) and torch.equal(shared.response_mask, full.response_mask)
        assert torch.allclose(shared.response_logprobs, full.response_logprobs, atol=1e-5)
        for i, prompt in enumerate(CHAT):  # the oracle: a fresh forward of [prompt | response]
            n = int(shared.response_mask[i].sum())
            ids = torch.tensor([prompt + shared.responses[i, :n].tolist()])
            fresh = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt) - 1:]
            assert torch.allclose(shared.response_logprobs[i, :n], fresh, atol=1e-5), i
