"""gen.compile: the compiled decode step (static caches, tensor slot) gives the eager tokens and
transformers' greedy tokens, keeps sampling batch-invariant, and survives compaction. One model,
so its graphs compile once or twice for the whole module (a minute or two on 2 CPU cores); the
whole generation suite also runs under MESHRL_GEN_COMPILE=1 (README, Tests)."""

from __future__ import annotations

import pytest
import torch
from model_hf_util import hf_model

from meshrl.model import GenerationConfig, generate, load_pretrained


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf")
    ref = hf_model("llama", kv_heads=2, vocab=96)
    ref.save_pretrained(path)
    return load_pretrained(path).eval(), ref


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in (5, 9, 3, 12, 7, 4)]


def test_compiled_greedy_equals_eager_and_transformers(pair):
    ours, ref = pair
    prompts = _prompts()
    cfg = dict(max_new_tokens=16, greedy=True, eos_token_id=None, pad_token_id=0)
    eager = generate(ours, prompts, GenerationConfig(**cfg, compile=False))
    comp = generate(ours, prompts, GenerationConfig(**cfg, compile=True))
    assert torch.equal(comp.responses, eager.responses)
    assert torch.allclose(comp.response_logprobs, eager.response_logprobs, atol=1e-5)
    for p, row in zip(prompts, comp.responses.tolist(), strict=True):
        want = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                            max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)[0, len(p):]
        assert row == want.tolist()


def test_compiled_sampling_is_batch_invariant_and_compacts(pair):
    ours, _ = pair
    prompts = _prompts()
    seeds = [11, 12, 13, 14, 15, 16]
    free = generate(ours, prompts, GenerationConfig(max_new_tokens=24, eos_token_id=None), seeds).responses
    eos = int(free.flatten().mode().values)  # frequent: rows end early, at different steps
    cfg = dict(max_new_tokens=24, eos_token_id=eos, pad_token_id=0, top_k=20, sync_every=2)
    eager = generate(ours, prompts, GenerationConfig(**cfg, compile=False, compact_below=0.0), seeds)
    comp = generate(ours, prompts, GenerationConfig(**cfg, compile=True, compact_below=0.9), seeds)
    assert torch.equal(comp.responses, eager.responses) and torch.equal(comp.response_mask, eager.response_mask)
    lens = eager.response_mask.sum(1)
    assert lens.min() < lens.max()  # compaction had something to drop
    alone = generate(ours, prompts[3:4], GenerationConfig(**cfg, compile=True), seeds[3:4])
    n = int(alone.response_mask.sum())
    assert alone.responses[0, :n].tolist() == eager.responses[3, :n].tolist()


@pytest.mark.parametrize("compile_,family",
                         [(False, "tiny"), (True, "tiny"), (False, "qwen2-bias"), (False, "tiny-qwen3")])
def test_fused_projections_give_the_unfused_tokens(monkeypatch, compile_, family):
    """bf16 on a CPU decodes with q|k|v and gate|up concatenated (decode_weights.fuse_projections): the
    same tokens and log-probs as the separate matmuls, bit for bit; and the copies are made per
    generation, so a weight update shows in the next one."""
    from meshrl.model import decode_weights as G
    from meshrl.model.generation import GenerationConfig, generate
    from meshrl.model.checkpoint import build_model

    from dataclasses import replace

    from meshrl.model.presets import get_preset

    monkeypatch.setattr(G, "native_bf16", lambda: False)  # the fused path (a CPU without bf16 dot products)
    torch.manual_seed(0)
    cfg = replace(get_preset("tiny"), model_type="qwen2", attention_bias=True) if family == "qwen2-bias" else family
    model = build_model(cfg).to(torch.bfloat16)
    assert G.fuse_projections(model.lm_head.weight)
    prompts, seeds = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]], [1, 2, 3]
    cfg = GenerationConfig(max_new_tokens=12, compile=compile_)
    fused = generate(model, prompts, cfg, seeds)
    with monkeypatch.context() as m:
        m.setattr(G, "fuse_projections", lambda w: False)
        plain = generate(model, prompts, cfg, seeds)
    assert torch.equal(fused.responses, plain.responses)
    assert torch.equal(fused.response_logprobs, plain.response_logprobs)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.up_proj.weight.mul_(-1)
    changed = generate(model, prompts, cfg, seeds)
    assert not torch.equal(changed.response_logprobs, fused.response_logprobs)


def test_prefill_runs_compiled_and_fills_the_cache_as_eager(pair, monkeypatch):
    """gen.compile's prefill: each dense layer filling its cache from slot 0 goes through the compiled
    layer function (dynamic shapes), with the eager hidden states and cache contents."""
    import meshrl.model.compiled_layers as cl
    from meshrl.model.decode_weights import make_caches
    from meshrl.model.prompt_batch import left_pad

    ours, _ = pair
    calls = []
    real = cl._compiled_prefill_call
    monkeypatch.setattr(cl, "_compiled_prefill_call", lambda device_type: calls.append(1) or real(device_type))
    ids, mask = left_pad(_prompts(), 0, torch.device("cpu"))
    # as generation makes them under gen.compile: no packed weights (those are eager decoding's)
    eager_caches, comp_caches = make_caches(ours, len(ids), 32, pack=False), make_caches(ours, len(ids), 32, pack=False)
    with torch.inference_mode():
        eager = ours.model(ids, mask, eager_caches, 0)
        comp = ours.model(ids, mask, comp_caches, 0, layer_fn=cl.prefill_layer)
        assert len(calls) == len(ours.model.layers)
        assert torch.allclose(comp, eager, atol=1e-5)
        for a, b in zip(comp_caches, eager_caches, strict=True):
            assert torch.allclose(a.k, b.k, atol=1e-5) and torch.allclose(a.v, b.v, atol=1e-5)
        # a decode step (tensor slot) is not a prefill: the eager layers run it
        slot = torch.tensor(ids.shape[1])
        full = torch.nn.functional.pad(mask, (0, 32 - ids.shape[1]), value=1)
        ours.model(ids[:, -1:], full, comp_caches, slot, layer_fn=cl.prefill_layer)
        assert len(calls) == len(ours.model.layers)


def test_bf16_decode_step_compiles_without_graph_breaks(pair):
    """In bf16 the attention asks whether the CPU has bf16 dot products (cpu_features reads
    /proc/cpuinfo, which dynamo cannot trace): a constant to torch.compile, not a graph break in every
    layer (which left the compiled bf16 step ~1.7x slower)."""
    import copy

    import torch._dynamo.utils as dynamo_utils

    ours = copy.deepcopy(pair[0]).to(torch.bfloat16)
    dynamo_utils.counters.clear()
    generate(ours, _prompts(), GenerationConfig(max_new_tokens=4, greedy=True, eos_token_id=None, pad_token_id=0,
                                                compile=True))
    assert not dynamo_utils.counters["graph_break"], dict(dynamo_utils.counters["graph_break"])
