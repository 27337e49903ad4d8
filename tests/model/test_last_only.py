"""Backbone.forward(last_only=True), a prefill's last layer computing only the last position's
output: the same hidden state at position S-1 and the same KV caches as the full forward, with left
padding (the packed layout), without padding (plain causal attention), for LLaMA, Qwen3 (q/k norms)
and a MoE model."""

from __future__ import annotations

import pytest
import torch

from meshrl.model import build_model
from meshrl.model.decode_weights import make_caches
from meshrl.model.prompt_batch import left_pad


def _batches(vocab: int) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(0)
    ragged = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 9, 3, 12)]
    even = [torch.randint(3, vocab, (7,), generator=g).tolist() for _ in range(3)]
    return [ragged, even, ragged[1:2]]


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3", "tiny-moe"])
def test_last_only_equals_the_full_forward(preset):
    torch.manual_seed(0)
    model = build_model(preset).eval()
    for prompts in _batches(model.config.vocab_size):
        ids, mask = left_pad(prompts, 0, torch.device("cpu"))
        full_caches, last_caches = make_caches(model, len(ids), 32), make_caches(model, len(ids), 32)
        with torch.inference_mode():
            full = model.model(ids, mask, full_caches, 0)
            last = model.model(ids, mask, last_caches, 0, last_only=True)
        assert last.shape == (len(ids), 1, model.config.hidden_size)
        torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-5)
        for a, b in zip(last_caches, full_caches, strict=True):
            assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
