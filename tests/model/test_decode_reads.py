"""What an eager CPU decode step reads (meshrl/model/attention.py ``Attention``): the whole KV buffers
in bf16 once half of them is written (``KVCache.reads_whole``), and q and k rotated by one call out
of the fused projections (``Attention._joint_rope``); both give the very bits of the code they replace."""

from __future__ import annotations

import pytest
import torch

import meshrl.model.decode_weights as decode_weights
from meshrl.model.batch_layout import KVCache
from meshrl.model.checkpoint import build_model
from meshrl.model.decode_weights import make_caches, native_bf16
from meshrl.model.generation import GenerationConfig, generate
from meshrl.model.presets import PRESETS
from meshrl.model.rope import rope_cos_sin
from meshrl.model.attention import Attention, apply_rope, rope_tables


def test_whole_reads_start_at_half_the_slots_and_only_for_bf16_caches():
    cache = KVCache(2, 1, 10, 4, torch.bfloat16, "cpu")
    assert not cache.reads_whole(9)  # off unless make_caches says so
    cache.whole_reads = True
    assert cache.reads_whole(5) and cache.reads_whole(10) and not cache.reads_whole(4)
    model = build_model("tiny", seed=0)
    assert not any(c.whole_reads for c in make_caches(model, 2, 8))  # float32: MKL reads a strided batch
    assert all(c.whole_reads for c in make_caches(model.to(torch.bfloat16), 2, 8))


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no bf16 dot products (AVX512-BF16 / AMX)")
def test_whole_cache_reads_give_the_prefix_reads_bits(monkeypatch):
    model = build_model("tiny", seed=0).to(torch.bfloat16)
    prompts = [[5, 6, 7, 9, 3], [8, 9], [10, 11, 12, 13, 14, 15], [14]]
    cfg = GenerationConfig(max_new_tokens=12, greedy=True, eos_token_id=None, pad_token_id=0)
    whole_steps = []
    real = KVCache.reads_whole
    monkeypatch.setattr(KVCache, "reads_whole", lambda self, n: whole_steps.append(real(self, n)) or whole_steps[-1])
    whole = generate(model, prompts, cfg)
    assert any(whole_steps) and not all(whole_steps)  # the early steps read the prefix, the later the whole
    monkeypatch.setattr(decode_weights, "whole_cache_reads", lambda w: False)
    prefix = generate(model, prompts, cfg)
    assert torch.equal(whole.responses, prefix.responses)
    assert torch.equal(whole.response_logprobs, prefix.response_logprobs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("last", [False, True])
def test_joint_rotation_is_one_rotation_each(dtype, last):
    cfg = PRESETS["tiny"]
    attn = Attention(cfg)
    b, s, d = 3, 5, cfg.head_dim
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    qkv = torch.randn(b, s, (hq + 2 * hkv) * d, generator=torch.Generator().manual_seed(0)).to(dtype)
    pos = torch.arange(s).repeat(b, 1) + torch.arange(b)[:, None]
    cos, sin = rope_tables(*rope_cos_sin(pos, cfg, dtype))
    q, k, v = attn._joint_rope(qkv, cos, sin, hq, last)
    q0, k0, v0 = qkv.split([hq * d, hkv * d, hkv * d], -1)
    q0 = q0.view(b, s, hq, d).transpose(1, 2)
    want_q = apply_rope(q0, cos, sin)[:, :, -1:] if last else apply_rope(q0, cos, sin)
    assert torch.equal(q, want_q)
    assert torch.equal(k, apply_rope(k0.view(b, s, hkv, d).transpose(1, 2), cos, sin))
    assert torch.equal(v, v0.view(b, s, hkv, d).transpose(1, 2))
