"""The estimator's activation terms (plan/model_costs.py) against what the model code itself holds.

Oracle: the real decoder (meshrl/model/transformer.py) run on fake tensors with a byte counter
(runtime/fake_exec.FakeRank): the bytes autograd keeps after a training forward, and the peak of a
forward without autograd, per token and layer, counted by torch rather than by the formula.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from meshrl import cpu_features
from meshrl.model import worst_case
from meshrl.model.presets import get_preset
from meshrl.model.transformer import Backbone
from meshrl.plan.model_costs import model_costs
from meshrl.runtime.fake_exec import FakeRank

B, S = 4, 256
DTYPES = {"bfloat16": (torch.bfloat16, 2), "float32": (torch.float32, 4)}


def _cfg(preset: str, layers: int = 3):
    """The preset with a few layers: the peak of a forward without autograd is in a layer after the
    first, whose input the caller holds (the first one's is the test's, counted before)."""
    return dataclasses.replace(get_preset(preset), num_hidden_layers=layers)


def _measure(cfg, dtype: torch.dtype, grad: bool, device: str | None = "cuda", s: int = S) -> tuple[float, float]:
    """-> (bytes kept after a forward of the layers with autograd, peak above the input without);
    ``device``: the device type the model code's branches take (None: the CPU the tensors are on);
    ``s``: the sequence length."""
    before = torch.get_default_dtype()
    with FakeTensorMode(), FakeRank() as counter, worst_case.worst_case(device=device):
        torch.set_default_dtype(dtype)  # fake weights of the dtype, made so (fake storages can't be cast in place)
        try:
            model = Backbone(cfg)
        finally:
            torch.set_default_dtype(before)
        model.embed_tokens, model.norm = None, None  # the decoder layers alone
        x = torch.randn(B, s, cfg.hidden_size, dtype=dtype, requires_grad=grad)
        base = counter.live
        counter.start_window()
        with torch.set_grad_enabled(grad):
            out = model(x)
        # the layers' output is the caller's; their input too, but a float32 norm keeps it itself
        # (a bf16 one keeps a float32 copy, counted), as it keeps every other layer's input
        kept = counter.live - base - out.numel() * out.element_size()
        if dtype.itemsize >= 4:
            kept += x.numel() * x.element_size()
        return kept, counter.window.peak - base


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama3", "tiny-qwen3", "tiny-moe"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_training_forward_keeps_what_the_estimator_prices(preset, dtype):
    cfg = _cfg(preset)
    torch_dtype, nbytes = DTYPES[dtype]
    kept, _ = _measure(cfg, torch_dtype, grad=True)
    per = kept / (B * S * cfg.num_hidden_layers)
    # rope's cos/sin [B, S, head_dim] are kept once, not per layer: within a few percent
    assert per == pytest.approx(model_costs(cfg).act_bytes_per_token_layer(1, nbytes), rel=0.04), per


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama3", "tiny-qwen3", "tiny-moe"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_without_autograd_peaks_where_the_estimator_says(preset, dtype):
    cfg = _cfg(preset)
    torch_dtype, nbytes = DTYPES[dtype]
    _, peak = _measure(cfg, torch_dtype, grad=False)
    per = peak / (B * S)
    assert per == pytest.approx(model_costs(cfg).infer_bytes_per_token(1, nbytes), rel=0.05), per


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_the_fused_decoding_copies_of_bf16_on_a_cpu_are_priced(preset, monkeypatch):
    """Generation in bf16 on a CPU copies each layer's q|k|v and gate|up weights (model/decode_weights.py
    fused_weights): the estimator adds those bytes to a generate call there, and only there (on a
    CPU without bf16 dot products, whose prefill attention is SDPA's, as on the GPU)."""
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)
    from meshrl.layout.mesh import Layout
    from meshrl.model.decode_weights import fused_weights
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call
    from meshrl.plan.hardware import PRESETS

    cfg = _cfg(preset)
    model = Backbone(cfg).to(torch.bfloat16)
    copies = 0
    for layer in model.layers:
        qkv, gate_up = fused_weights(layer)
        copies += sum(t.numel() * t.element_size() for t in (qkv[0], gate_up) if t is not None)
    assert model_costs(cfg).fused_decode_bytes(1, 1, 2) == copies
    spec, shape = CallSpec("actor_gen", "actor", "generate", cfg), RunShape(16, 16, 8)
    gpu = PRESETS["h100-80g"]
    extra = {name: estimate_call(spec, shape, Layout(1, 1, 1), 1,
                                 dataclasses.replace(gpu, name=name, cpu=name == "cpu")).transient_bytes
             - estimate_call(spec, shape, Layout(1, 1, 1), 1, gpu).transient_bytes for name in ("cpu", "h100-80g")}
    assert extra == {"cpu": copies, "h100-80g": 0}


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_the_packed_float32_decoding_copies_on_a_cpu_are_priced(preset):
    """Eager float32 generation on a CPU packs each layer's projections and the LM head for oneDNN
    (model/decode_weights.py Packed): the estimator adds exactly those bytes to a generate call
    there, and neither under gen.compile nor on a GPU."""
    from meshrl.layout.mesh import Layout
    from meshrl.model.checkpoint import build_model
    from meshrl.model.decode_weights import make_caches
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call
    from meshrl.plan.hardware import PRESETS

    cfg = _cfg(preset)
    caches = make_caches(build_model(cfg), 4, 16)
    packs = [p for c in caches if c.packed for p in (c.packed.qkv, c.packed.o, c.packed.gate_up, c.packed.down)]
    packs += [caches[-1].head]
    copies = sum(p.weight.numel() * p.weight.element_size() for p in packs if p is not None)
    assert model_costs(cfg).fused_decode_bytes(1, 1, 4, packed=True) == copies
    spec, shape = CallSpec("actor_gen", "actor", "generate", cfg), RunShape(16, 16, 8)
    gpu = dataclasses.replace(PRESETS["h100-80g"], dtype_bytes=4)

    def extra(name, **kw):
        hw = dataclasses.replace(gpu, name=name, cpu=name == "cpu")
        s = dataclasses.replace(shape, **kw)
        return (estimate_call(spec, s, Layout(1, 1, 1), 1, hw).transient_bytes
                - estimate_call(spec, s, Layout(1, 1, 1), 1, gpu).transient_bytes)

    assert (extra("cpu"), extra("h100-80g"), extra("cpu", compile_gen=True)) == (copies, 0, 0)


def test_bf16_attention_on_a_cpu_keeps_float32_copies():
    """On a CPU, bf16 attention runs in float32 (model/transformer.py): counted as the layers keep it."""
    cfg = _cfg("tiny-llama3")
    kept = _measure(cfg, torch.bfloat16, grad=True, device=None)[0] / (B * S * cfg.num_hidden_layers)
    want = model_costs(cfg).act_bytes_per_token_layer(1, 2, cpu=True)
    assert kept == pytest.approx(want, rel=0.04) and want > model_costs(cfg).act_bytes_per_token_layer(1, 2)


@pytest.mark.parametrize("preset", ["tiny-llama3", "tiny-qwen3"])
def test_short_bf16_attention_on_a_cpu_is_priced(preset, monkeypatch):
    """On a CPU with bf16 dot products, bf16 attention over at most SHORT_ATTENTION_KEYS keys is
    short_attention (model/transformer.py), which keeps its score matrices: the estimator counts
    them per (query, key), with autograd and without, at the row length it is given (the test
    runs on any CPU: fake tensors run no kernel, so the CPU only decides the branch)."""
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: True)
    cfg, s = _cfg(preset), cpu_features.SHORT_ATTENTION_KEYS // 2
    kept, peak = _measure(cfg, torch.bfloat16, grad=True, device=None, s=s)[0], _measure(
        cfg, torch.bfloat16, grad=False, device=None, s=s)[1]
    mc = model_costs(cfg)
    want = mc.act_bytes_per_token_layer(1, 2, cpu=True, keys=s)
    assert kept / (B * s * cfg.num_hidden_layers) == pytest.approx(want, rel=0.04)
    assert want > mc.act_bytes_per_token_layer(1, 2, cpu=True, keys=4 * s)  # past the bound: SDPA's
    assert peak / (B * s) == pytest.approx(mc.infer_bytes_per_token(1, 2, cpu=True, keys=s), rel=0.05)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_one_tp_rank_s_logprobs_peak_where_the_estimator_says(dtype):
    """Inference's head on one tp rank: the logits, their float32 copy and logsumexp's one temporary
    (counted by FakeRank.WORKSPACE: its kernel allocates it out of a dispatch mode's sight)."""
    from meshrl.parallel.groups import Axis
    from meshrl.parallel.tensor import vocab_parallel_logprobs

    cfg = get_preset("tiny")
    torch_dtype, nbytes = DTYPES[dtype]
    with FakeTensorMode(), FakeRank() as counter:
        head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch_dtype)
        x = torch.randn(B, S, cfg.hidden_size, dtype=torch_dtype)
        targets = torch.zeros(B, S, dtype=torch.long)
        base = counter.live
        counter.start_window()
        with torch.no_grad():
            vocab_parallel_logprobs(head(x), targets, Axis((0,), 0, None), 0)
        peak = counter.window.peak - base
    priced = model_costs(cfg).head_bytes_per_token(1, nbytes) - nbytes * cfg.hidden_size  # x is the caller's
    assert peak / (B * S) == pytest.approx(priced, rel=0.02), (peak / (B * S), priced)


def test_logsumexp_s_own_temporary_is_counted():
    with FakeTensorMode(), FakeRank() as counter:
        z = torch.empty(64, 1000)
        counter.start_window()
        base = counter.live
        torch.logsumexp(z, -1)
        assert counter.window.peak - base >= z.numel() * 4


def test_bf16_decoding_on_a_cpu_with_bf16_dot_products_is_priced_packed(monkeypatch):
    """Where the CPU computes bf16 natively, eager bf16 decoding packs every projection and the LM
    head as float32 does (model/decode_weights.py pack_projections), so the estimator prices those
    copies, in bf16; under gen.compile decoding fuses q|k|v and gate|up instead."""
    from meshrl import cpu_features
    from meshrl.layout.mesh import Layout
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call
    from meshrl.plan.hardware import PRESETS

    monkeypatch.setattr(cpu_features, "native_bf16", lambda: True)
    cfg = _cfg("tiny")
    spec, shape = CallSpec("actor_gen", "actor", "generate", cfg), RunShape(16, 16, 8)
    gpu = PRESETS["h100-80g"]
    cpu = dataclasses.replace(gpu, name="cpu", cpu=True)

    def extra(**kw):
        s = dataclasses.replace(shape, **kw)
        return (estimate_call(spec, s, Layout(1, 1, 1), 1, cpu).transient_bytes
                - estimate_call(spec, s, Layout(1, 1, 1), 1, gpu).transient_bytes)

    # (both also hold bf16 attention's float32 working set, which a GPU does not)
    mc = model_costs(cfg)
    packed, fused = mc.fused_decode_bytes(1, 1, 2, packed=True), mc.fused_decode_bytes(1, 1, 2)
    assert extra() - extra(compile_gen=True) == packed - fused > 0
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)  # emulated bf16: fused either way
    assert extra() == extra(compile_gen=True)
