"""vLLM as meshrl's generation engine (meshrl/gen/vllm_engine.py), against meshrl's own engine on the
same weights: greedy tokens, the raw log-probs, EOS, per-row seeds, and the weight reload (the
sync after an actor update). One engine serves the module (making one takes seconds).

Tolerance on log-probs, 2e-4: both sides compute the same float32 network with different kernels
(vLLM-CPU's packed GEMMs and paged attention against torch's), i.e. differ by summation order only;
over 2 layers at hidden 64 that is ~1e-6 relative, and the log-probs here are ~-5: 2e-4 leaves two
orders of margin and is still ~50x below what one perturbed weight matrix moves them (checked)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from meshrl.gen.checks import vllm_installed
from meshrl.model.checkpoint import build_model
from meshrl.model.generation import GenerationConfig, generate, sequence_logprobs
from meshrl.model.presets import get_preset

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")]
TOL = 2e-4
# The demo preset at head_dim 32 (vLLM-CPU's attention has no kernel for the demo's 16)
CFG = dataclasses.replace(get_preset("tiny"), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def spread(model: torch.nn.Module) -> torch.nn.Module:
    """Weights of std 0.1, so greedy decoding is far from ties and a token comparison tests the model."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1) if p.dim() > 1 else p.fill_(1.0)
    return model.eval()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [[257] + torch.randint(0, 256, (3 + i % 7,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def engine():
    from meshrl.gen.vllm_engine import VllmGenerator

    torch.manual_seed(0)
    model = spread(build_model(CFG, seed=0))
    gen = VllmGenerator(CFG, torch.float32, seed=0, max_len=256)
    gen.load_weights(model.state_dict().items())
    return gen, model


def test_greedy_tokens_and_logprobs_equal_meshrl(engine):
    gen, model = engine
    ps = prompts(16)
    cfg = GenerationConfig(max_new_tokens=24, greedy=True, pad_token_id=256)
    ours, theirs = generate(model, ps, cfg), gen.generate(ps, cfg)
    assert torch.equal(theirs.responses, ours.responses)
    assert torch.equal(theirs.response_mask, ours.response_mask)
    assert (theirs.response_logprobs - ours.response_logprobs).abs().max() < TOL


def test_stop_token_ends_the_row_and_is_kept(engine):
    gen, model = engine
    ps = prompts(4)
    free = gen.generate(ps, GenerationConfig(max_new_tokens=24, greedy=True, pad_token_id=256))
    eos = int(free.responses[0, 2])  # row 0's third token becomes the stop token
    cut = gen.generate(ps, GenerationConfig(max_new_tokens=24, greedy=True, eos_token_id=eos, pad_token_id=256))
    ours = generate(model, ps, GenerationConfig(max_new_tokens=24, greedy=True, eos_token_id=eos, pad_token_id=256))
    first = (free.responses[0] == eos).nonzero()[0, 0].item()
    assert int(cut.response_mask[0].sum()) == first + 1 and int(cut.responses[0, first]) == eos
    assert torch.equal(cut.response_mask, ours.response_mask)
    assert torch.equal(cut.responses * cut.response_mask, ours.responses * ours.response_mask)


def test_a_row_samples_from_its_own_seed(engine):
    gen, _ = engine
    ps = prompts(6)
    cfg = GenerationConfig(max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.9, pad_token_id=256)
    a = gen.generate(ps, cfg, seeds=[10, 11, 12, 13, 14, 15])
    b = gen.generate(ps[3:] + ps[:3], cfg, seeds=[13, 14, 15, 10, 11, 12])  # other batch positions
    assert torch.equal(a.responses, torch.cat([b.responses[3:], b.responses[:3]]))
    c = gen.generate(ps, cfg, seeds=[20, 21, 22, 23, 24, 25])
    assert not torch.equal(a.responses, c.responses)


def test_sampled_logprobs_are_the_raw_model_distribution(engine):
    """At temperature 0.7 and top_k 5 the returned log-probs are still log_softmax of the raw logits,
    i.e. what the trainer recomputes (meshrl's contract)."""
    gen, model = engine
    ps = prompts(8)
    out = gen.generate(ps, GenerationConfig(max_new_tokens=12, temperature=0.7, top_k=5, pad_token_id=256),
                       seeds=list(range(8)))
    for i, p in enumerate(ps):
        n = int(out.response_mask[i].sum())
        ids = torch.tensor([p + out.responses[i, :n].tolist()])
        ref = sequence_logprobs(model, ids)[0, len(p) - 1:]
        assert (out.response_logprobs[i, :n] - ref).abs().max() < TOL


def test_reloaded_weights_are_the_ones_generating(engine):
    """The weight sync: after load_weights of an updated model, vLLM's log-probs of a fixed sequence are
    the new model's (within TOL) and far from the old one's; then the old weights come back the same way."""
    gen, model = engine
    ps = prompts(4, seed=3)
    cfg = GenerationConfig(max_new_tokens=10, greedy=True, pad_token_id=256)
    old = gen.generate(ps, cfg)
    new_model = build_model(CFG, seed=0)
    new_model.load_state_dict(model.state_dict())
    w = new_model.model.layers[1].mlp.down_proj.weight
    with torch.no_grad():
        w.add_(0.05 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
    sent = gen.load_weights(new_model.state_dict().items())
    assert sent == sum(t.numel() * 4 for t in new_model.state_dict().values())
    fixed = [p + old.responses[i, :int(old.response_mask[i].sum())].tolist() for i, p in enumerate(ps)]
    got = gen.generate(fixed, GenerationConfig(max_new_tokens=1, greedy=True, pad_token_id=256))
    moved = []
    for i, seq in enumerate(fixed):
        ids = torch.tensor([seq + [got.responses[i, 0].item()]])
        ref_new, ref_old = sequence_logprobs(new_model, ids)[0, -1], sequence_logprobs(model, ids)[0, -1]
        assert abs(got.response_logprobs[i, 0] - ref_new) < TOL
        moved.append(abs(ref_new - ref_old))
    assert max(moved) > 50 * TOL  # the perturbation is visible: the test can fail
    gen.load_weights(model.state_dict().items())
    assert torch.equal(gen.generate(ps, cfg).responses, old.responses)


def test_a_tied_head_follows_the_embedding_without_being_sent():
    """meshrl's shard map has no lm_head.weight for a tied model; the engine must still tie it (vLLM's
    reload would otherwise keep its dummy head: found on SmolLM2, log-probs ~-10.7 everywhere)."""
    from meshrl.gen.vllm_engine import VllmGenerator

    cfg = dataclasses.replace(CFG, tie_word_embeddings=True)
    model = spread(build_model(cfg, seed=2))
    gen = VllmGenerator(cfg, torch.float32, seed=0, max_len=256)
    gen.load_weights((k, v) for k, v in model.state_dict().items() if k != "lm_head.weight")
    ps = prompts(6)
    g = GenerationConfig(max_new_tokens=8, greedy=True, pad_token_id=256)
    ours, theirs = generate(model, ps, g), gen.generate(ps, g)
    gen.close()
    assert torch.equal(theirs.responses, ours.responses)
    assert (theirs.response_logprobs - ours.response_logprobs).abs().max() < TOL
