"""``train.compile`` (meshrl/model/compiled_layers.py): a one-rank ParallelModel whose layers run
compiled gives the eager model's log-probs and gradients (float32: up to the fused kernels'
rounding), with and without padding and without gradients; calls with a KV cache (generation)
stay eager; MoE layers stay eager. One process, real gloo group of one rank."""

import pytest
import torch

from meshrl.layout.mesh import Placement
from meshrl.model.checkpoint import build_model
from meshrl.model.compiled_layers import compile_layers
from meshrl.model.generation import GenerationConfig, generate
from meshrl.parallel.groups import GroupCache
from meshrl.parallel.load import InitLoader
from meshrl.parallel.model import ParallelModel
from meshrl.runtime.launch import RankPool


def _loss(out, mb):
    return -(out.logprobs * mb["attention_mask"][:, 1:]).sum() / 100


def _run(compiled: bool, preset: str) -> dict:
    cfg = build_model(preset).config
    pm = ParallelModel.create(cfg, Placement.parse("dp1tp1pp1@0"), GroupCache(timeout_s=60),
                              InitLoader(preset, 3, dtype=torch.float32), compile_layers=compiled)
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, (b, s, pad) in {"padded": (4, 12, 3), "other shape": (3, 9, 2), "unpadded": (2, 10, 0)}.items():
        ids = torch.randint(1, 250, (b, s), generator=g)
        mask = torch.ones_like(ids)
        mask[: b // 2, :pad] = 0
        batch = {"input_ids": ids, "attention_mask": mask}
        for p in pm.named.values():
            p.grad = None
        pm.forward_backward(batch, _loss, micro_batches=1)
        out[name] = {n: p.grad.clone() for n, p in pm.named.items()}
        with torch.no_grad():
            out[name + " logprobs"] = pm.logprobs(ids, mask)
    return out


def _compare(preset: str) -> list[str]:
    import torch._dynamo.utils as du

    eager = _run(False, preset)
    graphs = du.counters["stats"]["unique_graphs"]
    comp = _run(True, preset)
    bad = [] if du.counters["stats"]["unique_graphs"] > graphs else ["nothing was compiled"]
    for key in eager:
        a, b = eager[key], comp[key]
        pairs = a.items() if isinstance(a, dict) else [("logprobs", a)]
        for n, x in pairs:
            y = b[n] if isinstance(b, dict) else b
            real = torch.isfinite(x)
            if not torch.allclose(x[real], y[real], rtol=1e-4, atol=1e-5):
                bad.append(f"{key} {n}: {(x[real] - y[real]).abs().max():.2e}")
    return bad


@pytest.mark.timeout(600)  # a few graphs compile (grad, no grad, padding, a second shape) per family
def test_compiled_layers_equal_eager():
    """LLaMA, and Qwen3 (its per-head q/k RMSNorms go through the compiled graph too)."""
    with RankPool(1, timeout=400) as pool:
        assert pool.run(_compare, "tiny") == [[]]
        assert pool.run(_compare, "tiny-qwen3") == [[]]


def test_generation_and_moe_layers_stay_eager():
    torch.manual_seed(0)
    model = build_model("tiny")
    before = generate(model, [[5, 6, 7], [8, 9]], GenerationConfig(max_new_tokens=4, greedy=True, compile=False))
    assert compile_layers(model.model.layers) == len(model.model.layers)
    assert compile_layers(model.model.layers) == 0  # once is enough
    import torch._dynamo.utils as du

    frames = du.counters["stats"]["unique_graphs"]
    after = generate(model, [[5, 6, 7], [8, 9]], GenerationConfig(max_new_tokens=4, greedy=True, compile=False))
    assert du.counters["stats"]["unique_graphs"] == frames  # nothing compiled for cached calls
    assert torch.equal(before.responses, after.responses)
    moe = build_model("tiny-moe")
    assert compile_layers(moe.model.layers) == sum(not layer.moe for layer in moe.model.layers)
