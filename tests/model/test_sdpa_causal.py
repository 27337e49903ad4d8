"""SDPA's causal flag (no mask tensor, so flash / memory-efficient kernels apply on a GPU) wherever
the batch allows it: no padding, or right padding only. Left padding keeps the mask. Both paths
against transformers (eager attention, an independent implementation) on the real tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from meshrl.model import load_pretrained
from meshrl.model.transformer import right_padded

from model_hf_util import hf_model  # tests/model is on sys.path


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Record (mask given, is_causal) of every scaled_dot_product_attention call."""
    calls: list[tuple[bool, bool]] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((attn_mask is not None, is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def _mask(b: int, s: int, pads: dict[int, tuple[int, int]]) -> torch.Tensor:
    """[b, s] ones with row r's first pads[r][0] and last pads[r][1] columns set to 0."""
    m = torch.ones(b, s, dtype=torch.long)
    for r, (left, right) in pads.items():
        m[r, :left] = 0
        if right:
            m[r, -right:] = 0
    return m


def test_right_padded():
    assert right_padded(None) and right_padded(torch.ones(2, 5))
    assert right_padded(_mask(3, 6, {0: (0, 2), 2: (0, 5)}))
    assert not right_padded(_mask(3, 6, {1: (1, 0)}))
    assert not right_padded(torch.tensor([[1, 0, 1, 1]]))  # a hole is not right padding


@pytest.mark.parametrize("pads,fast", [({}, True), ({0: (0, 4), 2: (0, 1)}, True),
                                       ({0: (3, 0)}, False), ({1: (2, 3)}, False)])
def test_causal_flag_where_the_batch_allows(tmp_path, sdpa_calls, pads, fast):
    ref = hf_model("llama", kv_heads=2)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    ids = torch.randint(3, ref.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(4))
    mask = _mask(3, 11, pads)
    with torch.no_grad():
        got = ours(ids, mask)
        want = ref(ids, attention_mask=mask).logits
    layers = ref.config.num_hidden_layers
    assert sdpa_calls == [(not fast, fast)] * layers  # every layer took the path the batch allows
    real = mask.bool()
    assert (got[real] - want[real]).abs().max().item() <= 1e-4


def test_fast_path_equals_the_masked_one(tmp_path, monkeypatch):
    """The two paths give the same numbers on real tokens, forward and backward (a right-padded
    batch through the causal path against the same batch forced through the mask)."""
    import meshrl.model.transformer as tr

    ref = hf_model("qwen2", kv_heads=1)
    ref.save_pretrained(tmp_path)
    ids = torch.randint(3, ref.config.vocab_size, (4, 13), generator=torch.Generator().manual_seed(5))
    mask = _mask(4, 13, {0: (0, 6), 3: (0, 2)})
    runs = []
    for force_mask in (False, True):
        if force_mask:
            monkeypatch.setattr(tr, "right_padded", lambda m: False)
        model = load_pretrained(tmp_path)
        logits = model(ids, mask)
        (logits.float().log_softmax(-1)[mask.bool()].mean()).backward()
        runs.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (a, ga), (b, gb) = runs
    real = mask.bool()
    assert (a[real] - b[real]).abs().max().item() <= 1e-5
    for n in ga:
        assert torch.allclose(ga[n], gb[n], rtol=1e-4, atol=1e-6), n
