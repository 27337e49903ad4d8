"""Rollout correction (meshrl/algo/mismatch.py) on numbers worked out by hand, and the backend
checks that refuse what vLLM cannot run (meshrl/gen/checks.py)."""

from __future__ import annotations

import math

import pytest
import torch

from meshrl.algo.mismatch import TrainForwardMismatch, mismatch_metrics, rollout_weights
from meshrl.errors import UserError
from meshrl.gen.checks import check_backend
from meshrl.model.presets import get_preset

# two rows, three response tokens; row 1's last token is padding
ENGINE = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.8)], [math.log(0.1), math.log(0.9), 0.0]])
TRAINER = torch.tensor([[math.log(0.5), math.log(0.75), math.log(0.4)], [math.log(0.4), math.log(0.9), -3.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(ENGINE, TRAINER, MASK)
    diffs = [0.0, math.log(3), math.log(2), math.log(4), 0.0]  # |log 0.25/0.75|, |log 0.8/0.4|, |log 0.1/0.4|
    assert m["rollout/logp_diff_mean"] == pytest.approx(sum(diffs) / 5)
    assert m["rollout/logp_diff_max"] == pytest.approx(math.log(4))  # the padding's 3.0 is not counted
    k3 = [r - 1 - math.log(r) for r in (1.0, 3.0, 0.5, 4.0, 1.0)]  # r = pi_trainer / pi_engine
    assert m["rollout/mismatch_kl"] == pytest.approx(sum(k3) / 5)



def test_train_forward_mismatch_equals_the_batch_figures_in_any_split():
    """The figures gathered micro-batch by micro-batch and summed over replicas (the max through a
    vector of one entry per replica) equal mismatch_metrics over the rows at once."""
    want = mismatch_metrics(ENGINE, TRAINER, MASK)
    whole = TrainForwardMismatch()
    whole.add(TRAINER, ENGINE, MASK)
    assert whole.metrics(0, 1, None) == pytest.approx(want)
    replicas = [TrainForwardMismatch(), TrainForwardMismatch()]
    for i, r in enumerate(replicas):  # one row each, as two dp replicas would hold them
        r.add(TRAINER[i:i + 1], ENGINE[i:i + 1], MASK[i:i + 1])
    parts = [[r.diff, r.k3, r.tokens] + [r.max if j == i else 0.0 for j in range(2)] for i, r in enumerate(replicas)]
    total = [a + b for a, b in zip(*parts, strict=True)]
    got = [r.metrics(i, 2, lambda xs, i=i: total if xs == parts[i] else pytest.fail("not this replica's sums"))
           for i, r in enumerate(replicas)]
    assert got[0] == got[1] == pytest.approx(want)

def test_token_weights_are_truncated_ratios():
    w = rollout_weights(ENGINE, TRAINER, MASK, "token", 2.0, None)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.5], [2.0, 1.0, 0.0]]))  # 3 and 4 capped at 2


def test_sequence_weights_are_the_truncated_product():
    w = rollout_weights(ENGINE, TRAINER, MASK, "sequence", 2.0, None)
    # row 0: 1 * 3 * 0.5 = 1.5; row 1: 4 * 1 = 4 -> 2 (cap); padding stays 0
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]]))
    w = rollout_weights(ENGINE, TRAINER, MASK, "sequence", 10.0, None)
    assert torch.allclose(w[1, :2], torch.tensor([4.0, 4.0]))


def test_mask_above_drops_rows_by_their_mean_k3():
    # row 0's mean k3 = (0 + (2 - log 3) + (-0.5 + log 2)) / 3 = 0.3648; row 1's = (3 - log 4) / 2 = 0.8069
    w = rollout_weights(ENGINE, TRAINER, MASK, "off", 2.0, 0.5)
    assert torch.equal(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    w = rollout_weights(ENGINE, TRAINER, MASK, "token", 2.0, 0.2)
    assert torch.equal(w, torch.zeros(2, 3))


def test_equal_log_probs_change_nothing():
    w = rollout_weights(TRAINER, TRAINER, MASK, "sequence", 2.0, 1e-9)
    assert torch.equal(w, MASK.float())
    assert mismatch_metrics(TRAINER, TRAINER, MASK) == {"rollout/logp_diff_mean": 0.0, "rollout/logp_diff_max": 0.0,
                                                       "rollout/mismatch_kl": 0.0}


@pytest.mark.parametrize("tp,pp,model,device,words", [
    (1, 2, None, "cpu", "pp=2"),
    (2, 1, None, "cuda", "tp=2"),
    (1, 1, get_preset("tiny"), "cpu", "head_dim=16"),
])
def test_vllm_refuses_by_name(tp, pp, model, device, words):
    with pytest.raises(UserError, match=words):
        check_backend("vllm", "actor_gen", tp, pp, device, model)


def test_unknown_backend_and_meshrl_anything():
    with pytest.raises(UserError, match="gen.backend='sglang'"):
        check_backend("sglang", "actor_gen", 1, 1, "cpu", None)
    check_backend("meshrl", "actor_gen", 4, 4, "cpu", get_preset("tiny"))


def test_decoupled_ppo_loss_by_hand():
    """AReaL's decoupled objective on two tokens: behaviour policy 0.5 / 0.2 (what sampled them),
    proximal policy 0.4 / 0.4 (the actor before this update), current 0.6 / 0.3, advantages +1 / -1,
    eps 0.2, weight cap 2:
        token 0: w = min(0.4/0.5, 2) = 0.8, r = 0.6/0.4 = 1.5 -> clipped 1.2: 0.8 * max(-1.5, -1.2) = -0.96
        token 1: w = min(0.4/0.2, 2) = 2,   r = 0.3/0.4 = 0.75 -> 0.8:      2 * max(0.75, 0.8)    = 1.6
    token mean (-0.96 + 1.6) / 2 = 0.32."""
    from meshrl.algo.losses import policy_loss

    behav = torch.tensor([[math.log(0.5), math.log(0.2)]])
    prox = torch.tensor([[math.log(0.4), math.log(0.4)]])
    theta = torch.tensor([[math.log(0.6), math.log(0.3)]])
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.tensor([[1, 1]])
    w = rollout_weights(behav, prox, mask, "token", 2.0, None)
    assert torch.allclose(w, torch.tensor([[0.8, 2.0]]))
    loss, _ = policy_loss(theta, prox, adv, mask.float(), 0.2, 2.0, weights=w)
    assert float(loss) == pytest.approx(0.32, rel=1e-6)


def test_decoupled_ppo_clips_around_the_trainer_and_weights_by_the_behaviour_policy():
    """ppo.decoupled=true on meshrl's engine: the old log-probs become the trainer's recomputed ones
    (the proximal policy) and every token gets min(pi_prox / pi_behav, cap); without it, meshrl's
    engine keeps its own log-probs and no weights."""
    from meshrl.algo.batch import Batch
    from meshrl.algo.handles import LocalHandle
    from meshrl.algo.mismatch import rollout_correction
    from meshrl.config import load_config
    from meshrl.model import build_model

    model = build_model("tiny", seed=0).eval()
    ids = torch.randint(3, 200, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    stale = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]])  # what an older policy gave
    data = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": mask, "logp_old": stale})
    h = LocalHandle(model)
    cfg = load_config(None, ["algo=grpo", "ppo.decoupled=true", "ppo.rollout_is_cap=3"])
    got, stats = rollout_correction(h, data, cfg, 0, 1, 1, None)
    prox = h.logprobs(ids, torch.ones_like(ids), 1)[:, -3:] * mask
    assert torch.allclose(got["logp_old"], prox)
    assert torch.allclose(got["is_weight"], torch.exp(prox - stale).clamp(max=3.0) * mask)
    assert stats["rollout/logp_diff_max"] > 0.1
    plain, _ = rollout_correction(h, data, load_config(None, ["algo=grpo"]), 0, 1, 1, None)
    assert torch.equal(plain["logp_old"], stale) and "is_weight" not in plain
