"""The recipe options of the policy loss, the KL estimators and the LR schedule, each against a
case computed by hand (numbers worked out in the comments)."""

import math

import pytest
import torch

from meshrl.algo.kl import kl_estimate
from meshrl.algo.losses import Norm, aggregate, policy_loss
from meshrl.algo.lr_schedule import lr_factor

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_loss_aggregation_by_hand():
    n = Norm(tokens=4.0, seqs=2.0, width=3.0)
    assert float(aggregate(LOSS, MASK, n, "token-mean")) == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert float(aggregate(LOSS, MASK, n, "seq-mean-token-mean")) == pytest.approx((6 / 3 + 4 / 1) / 2)  # 3
    assert float(aggregate(LOSS, MASK, n, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)  # 5
    assert float(aggregate(LOSS, MASK, n, "seq-mean-token-sum-norm")) == pytest.approx(10 / (2 * 3))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_every_aggregation_is_additive_over_row_splits(mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g)
    m = (torch.rand(7, 5, generator=g) > 0.3).float()
    n = Norm(tokens=float(m.sum()), seqs=7.0, width=5.0)
    whole = aggregate(x, m, n, mode)
    parts = sum(aggregate(x[s], m[s], n, mode) for s in (slice(0, 2), slice(2, 3), slice(3, 7)))
    assert torch.allclose(whole, parts, atol=1e-6)


def _tok(lp, old, a, lo=0.2, hi=0.2, c=0.0):
    """One token's loss by the formulas: max(-A r, -A clip(r)), then min(., c|A|) for A < 0."""
    r = math.exp(lp - old)
    loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
    return min(loss, -a * c) if (c and a < 0) else loss


def test_clip_high_is_asymmetric():
    # r = e^0.25 = 1.284; A = 1: symmetric clip caps at 1.2 -> loss -1.2; clip_high 0.28 -> -1.28
    lp, old, adv, m = (torch.tensor([[v]]) for v in (0.25, 0.0, 1.0, 1.0))
    sym, st = policy_loss(lp, old, adv, m, 0.2, 1.0)
    dapo, st2 = policy_loss(lp, old, adv, m, 0.2, 1.0, clip_high=0.28)
    assert float(sym) == pytest.approx(-1.2) and float(dapo) == pytest.approx(-1.28)
    assert float(st["clipfrac"]) == 1.0 and float(st2["clipfrac"]) == 1.0
    # the lower side is unchanged by clip_high: r = e^-0.5 = 0.607, A = -1 -> max(0.607, 0.8) = 0.8
    lp = torch.tensor([[-0.5]])
    assert float(policy_loss(lp, old, -adv, m, 0.2, 1.0, clip_high=0.28)[0]) == pytest.approx(0.8)


def test_dual_clip_caps_negative_advantage_tokens():
    # r = e^2 = 7.389, A = -1: PPO loss = max(7.389, 1.2) = 7.389; dual clip c = 3 caps it at 3.
    # Positive A = 2 with r = e^2: max(-14.78, -2.4) = -2.4, untouched by the dual clip.
    lp = torch.tensor([[2.0, 2.0]])
    old = torch.zeros(1, 2)
    adv = torch.tensor([[-1.0, 2.0]])
    m = torch.ones(1, 2)
    plain, _ = policy_loss(lp, old, adv, m, 0.2, 2.0)
    dual, st = policy_loss(lp, old, adv, m, 0.2, 2.0, dual_clip=3.0)
    assert float(plain) == pytest.approx((math.exp(2) - 2.4) / 2, rel=1e-6)
    assert float(dual) == pytest.approx((3.0 - 2.4) / 2, rel=1e-6)
    assert float(st["dual_clipfrac"]) == pytest.approx(0.5)
    for lp_, a in ((2.0, -1.0), (0.1, -0.5), (-1.0, -2.0), (2.0, 2.0)):
        got = policy_loss(torch.tensor([[lp_]]), torch.zeros(1, 1), torch.tensor([[a]]), torch.ones(1, 1), 0.2, 1.0,
                          clip_high=0.3, dual_clip=3.0)[0]
        assert float(got) == pytest.approx(_tok(lp_, 0.0, a, hi=0.3, c=3.0), rel=1e-6)


def test_sequence_ratio_is_gspo():
    # row 0: log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214 on both tokens; A = 1 -> clipped at 1.2
    # row 1: log-ratios [-0.1, 0.0, 0.1] (masked third ignored? no: all real) -> s = exp(0) = 1
    lp = torch.tensor([[0.1, 0.3, 0.0], [-0.1, 0.0, 0.1]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    n = Norm(tokens=5.0, seqs=2.0)
    loss, _ = policy_loss(lp, old, adv, m, 0.2, n, ratio="sequence", agg="seq-mean-token-mean")
    # row 0: mean of two tokens of -1.2 = -1.2; row 1: -2 * 1 = -2  -> (-1.2 - 2) / 2
    assert float(loss.detach()) == pytest.approx((-1.2 - 2.0) / 2, rel=1e-6)
    loss.backward()
    # the gradient is the token's: d/dlp_t of -A s sg-form = -A s / |y| / seqs for unclipped row 1
    assert torch.allclose(lp.grad[1], torch.full((3,), -2.0 * 1.0 / 3 / 2), atol=1e-6)
    assert torch.allclose(lp.grad[0], torch.zeros(3))  # clipped: no gradient
    # the token ratio is clamped before exp: log-ratio 50 -> exp(20), a finite loss
    big, _ = policy_loss(torch.tensor([[50.0]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), 0.2, 1.0)
    assert float(big) == pytest.approx(math.exp(20.0), rel=1e-5)


def test_kl_abs_and_clamped_k3_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0, 0.0, -30.0]), torch.tensor([-1.5, -1.0, -30.0, 0.0])
    assert torch.allclose(kl_estimate(logp, ref, "abs"), torch.tensor([0.5, 1.0, 30.0, 30.0]))
    # k3 with log r = ref - logp: [-0.5, 1.0, -30 -> clamped -20, 30 -> clamped 20]
    k3 = torch.tensor([math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0, math.exp(-20) - 1 + 20, 10.0])
    k3[2] = min(float(k3[2]), 10.0)  # 19.0 -> clamped to 10 (verl's low_var_kl)
    assert torch.allclose(kl_estimate(logp, ref, "k3"), k3)


def test_lr_schedules_by_hand():
    # 10 steps, warmup 2: steps 0, 1 at 0.5, 1.0; then p = (s - 2) / 7 over steps 2..9
    assert [lr_factor(s, 10, "constant", 2) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(2, 10, "linear", 2, 0.1) == pytest.approx(1.0)
    assert lr_factor(9, 10, "linear", 2, 0.1) == pytest.approx(0.1)
    assert lr_factor(5, 10, "linear", 2, 0.0) == pytest.approx(1 - 3 / 7)
    assert lr_factor(2, 10, "cosine", 2, 0.0) == pytest.approx(1.0)
    assert lr_factor(9, 10, "cosine", 2, 0.2) == pytest.approx(0.2)
    assert lr_factor(5, 10, "cosine", 2, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 7)))
    assert lr_factor(0, 1, "cosine") == 1.0  # one step: no decay to divide by zero
