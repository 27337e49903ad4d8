"""GAE, whitening and the group baselines against plain-Python loops written from the papers."""

import math

import torch

from meshrl.algo.advantages import (gae, group_advantages, masked_whiten, remax_advantages, rloo_advantages,
                                    token_rewards)


def gae_reference(rewards, values, gamma, lam):
    """One unpadded episode, textbook recursion (Schulman et al. 2016, eq. 16)."""
    n = len(rewards)
    adv = [0.0] * n
    last = 0.0
    for t in reversed(range(n)):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def test_gae_by_hand_two_tokens():
    # r = [0, 1], V = [0.5, 0.2], gamma = 0.9, lam = 0.8:
    # delta_1 = 1 - 0.2 = 0.8; A_1 = 0.8
    # delta_0 = 0 + 0.9 * 0.2 - 0.5 = -0.32; A_0 = -0.32 + 0.72 * 0.8 = 0.256
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.tensor([[1, 1]]), 0.9, 0.8)
    assert torch.allclose(adv, torch.tensor([[0.256, 0.8]]))
    assert torch.allclose(ret, torch.tensor([[0.756, 1.0]]))


def test_gae_masks_padding_like_a_shorter_episode():
    g = torch.Generator().manual_seed(0)
    lengths = [5, 3, 1, 4]
    n = 6
    rewards = torch.randn(4, n, generator=g)
    values = torch.randn(4, n, generator=g)
    mask = torch.zeros(4, n, dtype=torch.long)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    # garbage in the padding must not leak into the real tokens
    rewards_p = torch.where(mask.bool(), rewards, torch.full_like(rewards, 100.0))
    values_p = torch.where(mask.bool(), values, torch.full_like(values, -50.0))
    adv, ret = gae(rewards_p, values_p, mask, 0.95, 0.9)
    for i, L in enumerate(lengths):
        a_ref, r_ref = gae_reference(rewards[i, :L].tolist(), values[i, :L].tolist(), 0.95, 0.9)
        assert torch.allclose(adv[i, :L], torch.tensor(a_ref), atol=1e-5)
        assert torch.allclose(ret[i, :L], torch.tensor(r_ref), atol=1e-5)
        assert (adv[i, L:] == 0).all() and (ret[i, L:] == 0).all()


def test_token_rewards_puts_score_on_last_real_token_and_kl_everywhere():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0]])
    r = token_rewards(torch.tensor([1.0, -2.0]), kl, mask, 0.5)
    expected = torch.tensor([[-0.05, -0.1, -0.15 + 1.0, 0.0], [-0.25 - 2.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(r, expected)


def test_masked_whiten_uses_only_real_tokens():
    x = torch.tensor([[1.0, 2.0, 3.0, 1000.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = masked_whiten(x, mask)
    # mean 2, unbiased std 1 over the three real tokens
    assert torch.allclose(w, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6)


def test_grpo_group_advantages_from_formula():
    scores = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 2.5]
    n = 4
    got = group_advantages(torch.tensor(scores), n).tolist()
    for gi in range(2):
        grp = scores[gi * n:(gi + 1) * n]
        mean = sum(grp) / n
        std = math.sqrt(sum((s - mean) ** 2 for s in grp) / (n - 1))
        for j in range(n):
            assert math.isclose(got[gi * n + j], (grp[j] - mean) / (std + 1e-6), rel_tol=1e-5)


def test_grpo_identical_rewards_give_zero_advantage():
    assert (group_advantages(torch.ones(8), 4) == 0).all()


def test_rloo_leave_one_out_baseline():
    scores = [1.0, 0.0, 0.0, 3.0]
    got = rloo_advantages(torch.tensor(scores), 4).tolist()
    for i, s in enumerate(scores):
        others = [x for j, x in enumerate(scores) if j != i]
        assert math.isclose(got[i], s - sum(others) / 3, rel_tol=1e-6)


def test_remax_baseline_is_the_greedy_reward():
    assert remax_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 0.0])).tolist() == [0.0, -1.0, 1.0]
