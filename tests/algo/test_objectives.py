"""Whole objectives as the train calls assemble them, against plain-Python loops: PPO's GAE with
the KL penalty in the reward, GRPO's loss with its k3 KL term, RLOO/ReMax with a sequence-level
KL penalty; and response log-probs that skip prompt and padding tokens."""

import math

import torch

from meshrl.algo.batch import Batch
from meshrl.algo.common import CallContext
from meshrl.algo.objectives import critic_free_advantages, ppo_advantages
from meshrl.commands.settings import load_settings
from meshrl.model import build_model
from meshrl.algo.calls import Place, _actor_loss_fn, ref_logprob_rows
from meshrl.algo.handles import LocalHandle

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
LOGP_OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
LOGP_REF = torch.tensor([[-1.2, -0.4, -1.0], [-0.3, -2.2, 0.0]])


def batch(**extra):
    return Batch({"response_mask": MASK, "logp_old": LOGP_OLD, "logp_ref": LOGP_REF, **extra})


def test_ppo_advantages_kl_in_reward_by_loop():
    cfg = load_settings(None, ["ppo.kl_coef=0.1", "ppo.gamma=0.9", "ppo.lam=0.8", "ppo.whiten_advantages=false"])
    values = torch.tensor([[0.2, 0.1, -0.1], [0.5, 0.4, 9.0]])
    scores = torch.tensor([1.0, -1.0])
    adv, ret = ppo_advantages(batch(values=values, scores=scores), cfg)
    for i in range(2):
        n = int(MASK[i].sum())
        r = [-0.1 * float(LOGP_OLD[i, t] - LOGP_REF[i, t]) for t in range(n)]  # k1 per token
        r[-1] += float(scores[i])
        last = 0.0
        for t in reversed(range(n)):
            nv = float(values[i, t + 1]) if t + 1 < n else 0.0
            last = r[t] + 0.9 * nv - float(values[i, t]) + 0.9 * 0.8 * last
            assert math.isclose(float(adv[i, t]), last, rel_tol=1e-5, abs_tol=1e-6)
            assert math.isclose(float(ret[i, t]), last + float(values[i, t]), rel_tol=1e-5, abs_tol=1e-6)
    assert adv[1, 2] == 0 and ret[1, 2] == 0


def test_rloo_and_remax_subtract_the_summed_kl_from_the_score():
    cfg = load_settings(None, ["algo=rloo", "data.samples_per_prompt=2", "ppo.kl_coef=0.5"])
    scores = torch.tensor([1.0, 0.0])
    adv = critic_free_advantages(batch(scores=scores), cfg, "rloo")
    s = [float(scores[i]) - 0.5 * sum(float(LOGP_OLD[i, t] - LOGP_REF[i, t]) for t in range(int(MASK[i].sum())))
         for i in range(2)]
    assert torch.allclose(adv[0], torch.tensor([s[0] - s[1]] * 3))
    assert torch.allclose(adv[1], torch.tensor([s[1] - s[0]] * 2 + [0.0]))
    cfg = load_settings(None, ["algo=remax", "ppo.kl_coef=0.5"])
    adv = critic_free_advantages(batch(scores=scores, scores_greedy=torch.tensor([0.0, 1.0])), cfg, "remax")
    assert torch.allclose(adv[:, 0], torch.tensor([s[0] - 0.0, s[1] - 1.0]))


def test_grpo_objective_by_loop():
    """GRPO's per-token loss: -min(r A, clip(r) A) + beta * k3, summed over real tokens / token count."""
    from meshrl.algo.common import StatSum

    cfg = load_settings(None, ["algo=grpo", "data.samples_per_prompt=2", "ppo.kl_coef=0.3"])
    model = build_model("tiny", seed=0)
    ids = torch.tensor([[256, 257, 51, 43, 52, 61, 55, 258, 256], [257, 50, 43, 50, 61, 52, 258, 256, 256]])
    attn = (ids != 256).long()
    rmask = attn[:, 6:].clone()
    rmask[0, :] = torch.tensor([1, 1, 0])
    rmask[1, :] = torch.tensor([1, 0, 0])
    scores = torch.tensor([1.0, 0.0])
    mb = Batch({"input_ids": ids, "attention_mask": attn, "response_mask": rmask, "scores": scores,
                "logp_old": torch.tensor([[-5.0, -6.0, 0.0], [-5.5, 0.0, 0.0]]),
                "logp_ref": torch.tensor([[-5.2, -5.0, 0.0], [-5.0, 0.0, 0.0]])})
    adv = critic_free_advantages(mb, cfg, "grpo")
    mb = mb.with_(advantages=adv)
    h = LocalHandle(model)
    loss = _actor_loss_fn(cfg, "loss", "k3", 3.0, StatSum())(h._head(mb.data, False), mb.data)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids, attn).float(), -1)
    a = [1 / (math.sqrt(0.5) + 1e-6) * 0.5, -1 / (math.sqrt(0.5) + 1e-6) * 0.5]  # (s - mean) / std
    total = 0.0
    for i in range(2):
        for t in range(int(rmask[i].sum())):
            lp = float(logp[i, 5 + t, ids[i, 6 + t]])
            r = math.exp(lp - float(mb["logp_old"][i, t]))
            pg = -min(r * a[i], max(min(r, 1.2), 0.8) * a[i])
            d = float(mb["logp_ref"][i, t]) - lp
            total += pg + 0.3 * (math.exp(d) - d - 1)
    assert math.isclose(float(loss.detach()), total / 3.0, rel_tol=1e-4)


def test_response_logprobs_skip_prompt_and_padding():
    model = build_model("tiny", seed=1)
    prompt = [257, 55, 43, 53, 61]
    resp = [49, 50, 258]
    ids = torch.tensor([[256, 256, *prompt, *resp, 256], [256, 256, 257, 56, 43, 56, 61, 49, 54, 258, 256]])
    attn = (ids != 256).long()
    rmask = attn[:, 7:].clone()
    rmask[0, 2] = 0  # a real token outside the response mask must get no log-prob either
    b = Batch({"input_ids": ids, "attention_mask": attn, "response_mask": rmask})
    got = ref_logprob_rows(LocalHandle(model), b, CallContext(load_settings(None, []), 0, None), Place())["logp_ref"]
    with torch.no_grad():
        alone = torch.log_softmax(model(torch.tensor([prompt + resp])).float(), -1)[0]
    # row 0's response starts at column 7, i.e. position 5 of the unpadded sequence
    for t in range(2):
        assert math.isclose(float(got[0, t]), float(alone[4 + t, resp[t]]), rel_tol=1e-4)
    assert got[0, 2] == 0 and got[0, 3] == 0 and got[1, 3] == 0
