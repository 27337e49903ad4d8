"""Mixed precision in ZeRO-1 AdamW (meshrl/parallel/data.py): bf16 parameters and gradients with
fp32 master weights, against an independent oracle (torch's AdamW on an fp32 copy, rounded to bf16
after each step; the default, fused kernel); foreach AdamW bit-equal to the per-tensor loop, and the
fused kernel equal to it within rounding, resuming from its state dict; a checkpoint round trip
that keeps the master weights (bf16 alone would lose the low bits); on three gloo ranks, the
all-gather puts every rank's chunk (a short last one too) back in its place."""

import pytest
import torch
from torch import nn

from meshrl.config import load_config
from meshrl.errors import UserError
from meshrl.parallel.data import AdamWConfig, ZeroAdamW
from meshrl.parallel.groups import Axis
from meshrl.parallel.precision import torch_dtype

ALONE = Axis((0,), 0, None)
CFG = AdamWConfig(lr=1e-2, weight_decay=0.1)


def _params(dtype):
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in ((7, 5), (11,), (3, 4))]


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) for s in ((7, 5), (11,), (3, 4))]


def test_bf16_with_fp32_master_equals_the_oracle():
    params = _params(torch.bfloat16)
    opt = ZeroAdamW(params, ALONE, CFG)
    assert opt.impl == "fused"  # the default, on every device
    master = [nn.Parameter(p.detach().float().clone()) for p in params]  # the oracle's fp32 weights
    ref = torch.optim.AdamW(master, lr=CFG.lr, betas=CFG.betas, eps=CFG.eps, weight_decay=CFG.weight_decay,
                            foreach=False)
    for step in range(4):
        for p, m, g in zip(params, master, _grads(step), strict=True):
            p.grad = g.to(torch.bfloat16)
            m.grad = p.grad.float()
        opt.step()
        ref.step()
        for p, m in zip(params, master, strict=True):
            assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), m.detach().to(torch.bfloat16))
    # the fp32 state: master + m + v = 12 bytes per parameter at dp=1, bf16 weights 2 bytes
    n = sum(p.numel() for p in params)
    state = sum(t.numel() * t.element_size() for s in opt.opt.state.values() for t in s.values() if t.dim())
    assert state + sum(c.numel() * 4 for c in opt.chunks) == 12 * n


def test_fp32_chunks_are_views_and_foreach_matches_the_loop():
    a, b = _params(torch.float32), _params(torch.float32)
    oa = ZeroAdamW(a, ALONE, AdamWConfig(lr=CFG.lr, weight_decay=CFG.weight_decay, impl="foreach"))
    ob = ZeroAdamW(b, ALONE, AdamWConfig(lr=CFG.lr, weight_decay=CFG.weight_decay, impl="loop"))
    assert oa.chunks[0].data_ptr() == a[0].data_ptr()  # no master copy in fp32
    for step in range(3):
        for p, q, g in zip(a, b, _grads(step), strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_matches_the_loop(dtype):
    a, b = _params(dtype), _params(dtype)
    oa = ZeroAdamW(a, ALONE, AdamWConfig(lr=CFG.lr, weight_decay=CFG.weight_decay, impl="fused"))
    ob = ZeroAdamW(b, ALONE, AdamWConfig(lr=CFG.lr, weight_decay=CFG.weight_decay, impl="loop"))
    for step in range(3):
        for p, q, g in zip(a, b, _grads(step), strict=True):
            p.grad, q.grad = g.to(dtype), g.to(dtype)
        oa.step()
        ob.step()
    for c, d in zip(oa.chunks, ob.chunks, strict=True):  # the fp32 weights (master in bf16)
        torch.testing.assert_close(c, d, rtol=1e-6, atol=1e-7)
    fresh = ZeroAdamW([nn.Parameter(p.detach().clone()) for p in a], ALONE,
                      AdamWConfig(lr=CFG.lr, weight_decay=CFG.weight_decay, impl="fused"))
    fresh.load_state_dict(oa.state_dict())  # resumes: state (step counts included) back in place
    for p, g in zip(fresh.params, _grads(9), strict=True):
        p.grad = g.to(dtype)
    fresh.step()


def test_checkpoint_keeps_the_master_weights():
    params = _params(torch.bfloat16)
    opt = ZeroAdamW(params, ALONE, CFG)
    for p, g in zip(params, _grads(0), strict=True):
        p.grad = g.to(torch.bfloat16)
    opt.step()
    saved = opt.state_dict()
    assert "master" in saved
    fresh = ZeroAdamW([nn.Parameter(p.detach().clone()) for p in params], ALONE, CFG)
    fresh.load_state_dict(saved)
    for c, d in zip(opt.chunks, fresh.chunks, strict=True):
        assert torch.equal(c, d) and c.dtype == torch.float32


def test_train_dtype_key():
    assert torch_dtype("auto", cuda=False, bf16_cpu=False) == torch.float32
    assert torch_dtype("auto", cuda=True) == torch.bfloat16
    assert load_config(None, ["train.dtype=bfloat16"]).train.dtype == "bfloat16"
    with pytest.raises(UserError, match="train.dtype"):
        load_config(None, ["train.dtype=fp8"])


def _zero_on_dp3(dtype_name: str) -> list[torch.Tensor]:
    """Three ZeroAdamW steps on a dp3 axis of real gloo ranks; every rank's parameters after them."""
    from meshrl.layout.mesh import Placement
    from meshrl.parallel.groups import GroupCache

    groups = GroupCache(timeout_s=30).for_placement(Placement.parse("dp3tp1pp1@0-2"))
    params = _params(getattr(torch, dtype_name))
    opt = ZeroAdamW(params, groups.dp, CFG)
    for step in range(3):
        for p, g in zip(params, _grads(step), strict=True):
            p.grad = g.to(p.dtype)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.timeout(180)
def test_dp3_chunks_gathered_into_place_equal_one_rank():
    """Sizes 35, 11 and 12 over 3 ranks: chunks of 12/12/11, 4/4/3 and 4/4/4 (a short last chunk and
    an even split); after the all-gather every rank holds the parameters one rank alone computes."""
    from meshrl.runtime.launch import RankPool

    with RankPool(3, timeout=120) as pool:
        for dtype in ("float32", "bfloat16"):
            outs = pool.run(_zero_on_dp3, dtype)
            alone = _params(getattr(torch, dtype))
            opt = ZeroAdamW(alone, ALONE, CFG)
            for step in range(3):
                for p, g in zip(alone, _grads(step), strict=True):
                    p.grad = g.to(p.dtype)
                opt.step()
            for rank_params in outs:
                for got, want in zip(rank_params, alone, strict=True):
                    torch.testing.assert_close(got, want.detach(), rtol=1e-6, atol=0)
            for other in outs[1:]:  # the same bits on every rank
                assert all(torch.equal(a, b) for a, b in zip(outs[0], other, strict=True))
