"""Eager float32 decoding on a CPU (and bf16 on one with bf16 dot products) runs its projections and
LM head through oneDNN on weights packed once per generation (meshrl/model/decode_weights.py
``Packed``): the F.linear values up to rounding, the same bits for a row whatever its batch, and
only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from meshrl.model.checkpoint import build_model
from meshrl.model.decode_weights import Packed, make_caches, native_bf16, pack_projections
from meshrl.model.generation import GenerationConfig, generate


def test_packed_matmul_is_the_linear_and_batch_invariant():
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(96, 64, generator=g), torch.randn(96, generator=g), torch.randn(12, 1, 64, generator=g)
    lin = Packed(w, b, rows=12)
    got = lin(x)
    assert got.shape == (12, 1, 96)
    assert torch.allclose(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert torch.equal(lin(x[:5]), got[:5])  # fewer rows (a compacted batch): the same bits
    flat = torch.randn(1, 40, 64, generator=g)  # a prefill's unpadded tokens
    assert torch.allclose(lin(flat), F.linear(flat, w, b), rtol=1e-5, atol=1e-5)


def test_float32_weights_and_native_bf16_ones_on_a_cpu_are_packed(monkeypatch):
    import meshrl.model.decode_weights as G

    assert pack_projections(torch.zeros(4, 4))
    monkeypatch.setattr(G, "native_bf16", lambda: False)
    assert not pack_projections(torch.zeros(4, 4, dtype=torch.bfloat16))  # emulated bf16: fused_weights
    monkeypatch.setattr(G, "native_bf16", lambda: True)
    assert pack_projections(torch.zeros(4, 4, dtype=torch.bfloat16))  # AVX512-BF16 / AMX
    monkeypatch.undo()
    assert not pack_projections(torch.zeros(4, 4, dtype=torch.float64))  # oneDNN has no float64 matmul
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not pack_projections(torch.zeros(4, 4))  # a dry run's fake weights


def test_caches_carry_the_packed_layers_and_head_and_generation_matches_unpacked():
    model = build_model("tiny", seed=0)
    caches = make_caches(model, 4, 16)
    assert all(c.packed is not None for c in caches) and caches[-1].head is not None
    assert all(c.packed is None for c in make_caches(model, 4, 16, pack=False))
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    cfg = GenerationConfig(max_new_tokens=8, greedy=True, eos_token_id=None, pad_token_id=0)
    packed = generate(model, prompts, cfg)
    import meshrl.model.decode_weights as gen

    real = gen.pack_projections
    try:
        gen.pack_projections = lambda w: False
        plain = generate(model, prompts, cfg)
    finally:
        gen.pack_projections = real
    assert torch.equal(packed.responses, plain.responses)  # greedy on random weights: no near-ties here
    assert torch.allclose(packed.response_logprobs, plain.response_logprobs, atol=1e-5)


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no bf16 dot products (AVX512-BF16 / AMX)")
def test_packed_bf16_matmul_is_the_linear_and_batch_invariant():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).bfloat16()
    x = torch.randn(12, 1, 64, generator=g).bfloat16()
    lin = Packed(w, None, rows=12)
    got = lin(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float()), rtol=1e-2, atol=2e-2)
    assert torch.equal(lin(x[:5]), got[:5])  # a compacted batch: the same bits


def test_kept_copies_serve_the_next_call_until_the_weights_change():
    model = build_model("tiny", seed=0)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    cfg = GenerationConfig(max_new_tokens=6, greedy=True, eos_token_id=None, pad_token_id=0)
    first = generate(model, prompts, cfg)
    kept = model.__dict__["_meshrl_decode_copies"][1]
    assert kept.layers[0][0] is not None and kept.head is not None  # packed (float32 on a CPU)
    again = generate(model, prompts, cfg)
    assert model.__dict__["_meshrl_decode_copies"][1] is kept  # taken, not packed anew
    assert torch.equal(again.response_logprobs, first.response_logprobs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[5, 6, 7, 8]])).float().logsumexp(-1).sum().backward()
    opt.step()  # in place: every parameter's version moves
    after = generate(model, prompts, cfg)
    assert model.__dict__["_meshrl_decode_copies"][1] is not kept
    fresh = build_model("tiny", seed=0)
    fresh.load_state_dict(model.state_dict())
    want = generate(fresh, prompts, GenerationConfig(max_new_tokens=6, greedy=True, eos_token_id=None,
                                                     pad_token_id=0, keep_weights=False))
    assert torch.equal(after.response_logprobs, want.response_logprobs)
    assert not torch.equal(after.response_logprobs, first.response_logprobs)
    assert "_meshrl_decode_copies" not in fresh.__dict__
    generate(model, prompts, GenerationConfig(max_new_tokens=2, greedy=True, keep_weights=False))
    assert "_meshrl_decode_copies" not in model.__dict__  # a call that keeps nothing drops a kept set


def test_weights_made_under_inference_mode_are_packed_every_call():
    with torch.inference_mode():  # inference tensors have no version counter: nothing can be kept
        model = build_model("tiny", seed=0)
    prompts = [[5, 6, 7], [8, 9]]
    cfg = GenerationConfig(max_new_tokens=3, greedy=True, eos_token_id=None, pad_token_id=0)
    first = generate(model, prompts, cfg)
    assert "_meshrl_decode_copies" not in model.__dict__
    with torch.inference_mode():
        for p in model.parameters():
            p.mul_(0.5)
    assert not torch.equal(generate(model, prompts, cfg).response_logprobs, first.response_logprobs)
