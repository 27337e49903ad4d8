"""KL estimators and the PPO / value / DPO / BT / SFT losses against hand-computed values."""

import math

import torch

from meshrl.algo.kl import kl_estimate
from meshrl.algo.losses import (bradley_terry_loss, dpo_loss, entropy, policy_loss, sft_loss, token_logprobs,
                                value_loss)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    # log ratio = logp - ref = [0.5, -1.0]
    assert torch.allclose(kl_estimate(logp, ref, "k1"), torch.tensor([0.5, -1.0]))
    assert torch.allclose(kl_estimate(logp, ref, "k2"), torch.tensor([0.125, 0.5]))
    k3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]
    assert torch.allclose(kl_estimate(logp, ref, "k3"), torch.tensor(k3))


def test_kl_estimators_are_unbiased_where_the_theory_says():
    # Sampling from p, E[k1] = E[k3] = KL(p || q); k3 >= 0 pointwise.
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    true_kl = float((p * (p / q).log()).sum())
    x = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    lp, lq = p.log()[x], q.log()[x]
    assert abs(float(kl_estimate(lp, lq, "k1").mean()) - true_kl) < 0.01
    assert abs(float(kl_estimate(lp, lq, "k3").mean()) - true_kl) < 0.01
    assert (kl_estimate(lp, lq, "k3") >= 0).all()


def ppo_token_loss(logp, logp_old, adv, eps):
    r = math.exp(logp - logp_old)
    return -min(r * adv, max(min(r, 1 + eps), 1 - eps) * adv)


def test_policy_loss_matches_per_token_formula_and_masks():
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -3.0, -0.2]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -1.0, -9.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0], [-2.0, 0.5, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # last token of row 2 is padding
    denom = 7.0  # tokens in the whole mini-batch (this is one micro-batch of it)
    loss, stats = policy_loss(logp, old, adv, mask, 0.2, denom)
    expected = sum(ppo_token_loss(float(logp[i, j]), float(old[i, j]), float(adv[i, j]), 0.2)
                   for i in range(2) for j in range(3) if mask[i, j]) / denom
    assert math.isclose(float(loss), expected, rel_tol=1e-6)


def test_policy_loss_sums_over_micro_batches_to_the_mini_batch_loss():
    g = torch.Generator().manual_seed(1)
    logp, old, adv = (torch.randn(6, 5, generator=g) for _ in range(3))
    mask = (torch.rand(6, 5, generator=g) > 0.3).long()
    denom = float(mask.sum())
    whole, _ = policy_loss(logp, old, adv, mask, 0.2, denom)
    parts = sum(policy_loss(logp[s], old[s], adv[s], mask[s], 0.2, denom)[0] for s in (slice(0, 1), slice(1, 6)))
    assert torch.allclose(whole, parts, atol=1e-6)


def test_value_loss_by_hand():
    v, v_old, ret = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.0]]), torch.tensor([[2.0, 5.0]])
    mask = torch.tensor([[1, 0]])
    # token 0: unclipped (1-2)^2 = 1; clipped v = 0.5 + 0.2 = 0.7 -> (0.7-2)^2 = 1.69; max = 1.69
    loss, _ = value_loss(v, v_old, ret, mask, 0.2, 1.0)
    assert math.isclose(float(loss), 0.5 * 1.69, rel_tol=1e-6)


def test_dpo_loss_from_formula():
    pc, pr, rc, rr = torch.tensor([-3.0, -1.0]), torch.tensor([-4.0, -0.5]), torch.tensor([-3.5, -1.2]), \
        torch.tensor([-3.0, -0.6])
    beta = 0.5
    loss, stats = dpo_loss(pc, pr, rc, rr, beta, 2.0)
    ref = 0.0
    for i in range(2):
        m = beta * ((pc[i] - rc[i]) - (pr[i] - rr[i])).item()
        ref += -math.log(1 / (1 + math.exp(-m)))
    assert math.isclose(float(loss), ref / 2, rel_tol=1e-6)
    # margins: 0.5 * (0.5 + 1.0) = 0.75 > 0; 0.5 * (0.2 - 0.1) = 0.05 > 0
    assert float(stats["accuracy"]) == 1.0


def test_bradley_terry_and_sft():
    loss, st = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]), 2.0)
    ref = (-math.log(1 / (1 + math.exp(-1.0))) - math.log(1 / (1 + math.exp(1.0)))) / 2
    assert math.isclose(float(loss), ref, rel_tol=1e-6) and float(st["accuracy"]) == 0.5
    logp = torch.tensor([[-1.0, -2.0, -50.0]])
    assert math.isclose(float(sft_loss(logp, torch.tensor([[1, 1, 0]]), 4.0)), 0.75)


def test_token_logprobs_and_entropy():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # p = [0.25, 0.75]
    assert math.isclose(float(token_logprobs(logits, torch.tensor([[1]]))), math.log(0.75), rel_tol=1e-6)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert math.isclose(float(entropy(logits)), h, rel_tol=1e-6)
