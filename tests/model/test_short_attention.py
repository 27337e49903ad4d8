"""bf16 attention over short sequences on a CPU with bf16 dot products (attention.short_attention):
the attention itself against SDPA in float64, and the layers' choice of it (cpu_features.short_attention)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from meshrl import cpu_features
from meshrl.model import attention
from meshrl.model.presets import get_preset
from meshrl.model.attention import short_attention
from meshrl.model.transformer import Backbone


def _qkv(s: int, t: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 6, s, 8, generator=g, dtype=dtype), torch.randn(3, 2, t, 8, generator=g, dtype=dtype),
            torch.randn(3, 2, t, 8, generator=g, dtype=dtype))


@pytest.mark.parametrize("case", ["causal", "last", "mask"])
def test_short_attention_equals_sdpa(case):
    """Causal (S = T), a prefill's last query over every key, and a padding mask; 6 query heads over 2
    KV heads."""
    s, t = {"causal": (9, 9), "last": (1, 9), "mask": (4, 9)}[case]
    q, k, v = _qkv(s, t)
    mask = None
    if case == "mask":
        mask = torch.rand(3, 1, s, t, generator=torch.Generator().manual_seed(1)) > 0.4
        mask[..., -1] = True  # every query sees a key
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=case == "causal", enable_gqa=True)
    torch.testing.assert_close(short_attention(q, k, v, mask, causal=case != "last"), want, rtol=1e-12, atol=1e-13)


def test_short_attention_s_gradients_equal_sdpa_s():
    q, k, v = (x.requires_grad_() for x in _qkv(7, 7))
    grad = torch.randn(3, 6, 7, 8, dtype=torch.float64)
    ours = torch.autograd.grad(short_attention(q, k, v, None, True), (q, k, v), grad)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    sdpa = torch.autograd.grad(want, (q, k, v), grad)
    for a, b in zip(ours, sdpa, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_rule_is_bf16_on_a_cpu_with_bf16_dot_products_and_short_rows(monkeypatch):
    limit = cpu_features.SHORT_ATTENTION_KEYS
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: True)
    assert cpu_features.short_attention(True, limit) and cpu_features.short_attention(True, 1)
    assert not cpu_features.short_attention(True, limit + 1) and not cpu_features.short_attention(True, 0)
    assert not cpu_features.short_attention(False, 16)
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)
    assert not cpu_features.short_attention(True, 16)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("seq", [24, cpu_features.SHORT_ATTENTION_KEYS + 8])
def test_a_bf16_forward_takes_short_attention_where_the_rule_says(monkeypatch, native, seq):
    """A bf16 model on the CPU calls short_attention in every layer exactly where the rule says, and
    either path is within bf16's rounding of the float32 model's logits-to-be (the hidden states)."""
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: native)
    calls = []
    real = attention.short_attention
    monkeypatch.setattr(attention, "short_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    cfg = dataclasses.replace(get_preset("tiny-llama3"), num_hidden_layers=2)
    torch.manual_seed(0)
    model = Backbone(cfg)
    ids = torch.randint(3, cfg.vocab_size, (2, seq))
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, :3] = 0  # a left-padded row: the masked path
    with torch.no_grad():
        want = model(ids, mask)
        got = model.to(torch.bfloat16)(ids, mask)
    assert len(calls) == (cfg.num_hidden_layers if native and seq <= cpu_features.SHORT_ATTENTION_KEYS else 0)
    real_rows = mask.bool()
    err = (got.float() - want)[real_rows].abs().max().item()
    assert err < 0.1 * want[real_rows].abs().max().item(), err
