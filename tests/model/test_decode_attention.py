"""A CPU decode step's attention (attention.decode_attention) against SDPA, and a row's bits in any batch."""

import torch
import torch.nn.functional as F

from meshrl.model.attention import decode_attention


def _inputs(b: int, t: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 3, 3, 64, generator=g, dtype=dtype)
    k = torch.randn(b, 3, t + 8, 64, generator=g, dtype=dtype)[:, :, :t]  # a cache's filled part
    v = torch.randn(b, 3, t + 8, 64, generator=g, dtype=dtype)[:, :, :t]
    mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
    mask[1, ..., :5] = False  # a left-padded row
    return q, k, v, mask


def test_decode_attention_equals_sdpa():
    q, k, v, mask = _inputs(4, 37)
    torch.testing.assert_close(decode_attention(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               rtol=1e-5, atol=1e-6)
    q, k, v, mask = _inputs(4, 37, torch.float64)
    torch.testing.assert_close(decode_attention(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               rtol=1e-12, atol=1e-13)


def test_padded_keys_are_not_attended():
    q, k, v, mask = _inputs(4, 37)
    out = decode_attention(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, :5], v2[1, :, :5] = 1e3, -1e3  # what the mask hides may hold anything
    assert torch.equal(decode_attention(q, k2, v2, mask), out)


def test_a_row_gets_the_same_bits_in_any_batch():
    q, k, v, mask = _inputs(32, 115)
    full = decode_attention(q, k, v, mask)
    for rows in ([1], [0, 1, 2], list(range(1, 17))):
        part = decode_attention(q[rows], k[rows], v[rows], mask[rows])
        assert torch.equal(part, full[rows]), rows


def test_bf16_decode_attention_takes_its_softmax_in_float32():
    """bf16 scores, float32 probabilities cast back (HF's eager attention): within bf16's rounding of
    the float64 attention of the same inputs, and exactly the formula's bits."""
    q, k, v, mask = _inputs(4, 37, torch.bfloat16)
    out = decode_attention(q, k, v, mask)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=3e-2)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(64 ** -0.5).masked_fill_(~mask, float("-inf"))
    assert torch.equal(out, torch.matmul(scores.softmax(-1, dtype=torch.float32).to(torch.bfloat16), v))
