"""Multi-turn rollouts (meshrl/algo/multiturn.py) on a real tiny model: the training-side tokens
are exactly the sampled ones, the trainer's own forward pass gives the sampling log-probs on them,
and observation tokens get neither advantage nor gradient; env.fn is checked at load."""

from __future__ import annotations

import pytest
import torch

from meshrl.algo import setup
from meshrl.algo.advantages import gae, last_token_index
from meshrl.algo.calls import Place, generate_rows, score_rows
from meshrl.algo.common import CallContext
from meshrl.algo.handles import LocalHandle
from meshrl.algo.iteration import rollout_batch, rollout_metrics
from meshrl.algo.losses import Norm, policy_loss
from meshrl.algo.objectives import critic_free_advantages
from meshrl.commands.settings import load_settings
from meshrl.errors import UserError
from meshrl.model import build_model

ENV = "tests/algo/count_env.py"
BASE = ["algo=grpo", "data.batch_size=3", "data.samples_per_prompt=2", "env.max_turns=3", "env.max_tokens=24",
        "data.gen_len=6"]


class Recording(LocalHandle):
    """The one-process handle, keeping every generate call's prompts and outputs."""

    def __init__(self, model):
        super().__init__(model)
        self.calls = []

    def generate(self, prompts, gen_cfg, seeds=None, micro_batches=None):
        out = super().generate(prompts, gen_cfg, seeds, micro_batches)
        self.calls.append((prompts, out))
        return out


def _rollout(env="CountEnv", extra=()):
    cfg = load_settings(None, BASE + [f"env.fn={ENV}:{env}", *extra])
    tok = setup.tokenizer_for(cfg)
    b = rollout_batch(setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg)), cfg, 0)
    h = Recording(build_model("tiny", seed=3))
    ctx = CallContext(cfg, 0, tok)
    return cfg, b, h, ctx, generate_rows(h, b, ctx, Place())


def test_training_tokens_are_the_sampled_tokens():
    cfg, b, h, ctx, g = _rollout()
    p = b["prompt_ids"].shape[1]
    assert len(h.calls) == int(g["env_counts"][:, 0].max())  # one generate call per turn for the whole part
    for i in range(len(g)):
        real = g["input_ids"][i][g["attention_mask"][i].bool()].tolist()
        sampled = []
        for k, (prompts, out) in enumerate(h.calls):
            rows = [r for r in range(len(g)) if g["env_counts"][r, 0] > k]  # trajectories still going at turn k
            if i not in rows:
                continue
            j = rows.index(i)
            assert prompts[j] == real[:len(prompts[j])]  # the next turn's prompt is the ids so far
            n = int(out.response_mask[j].sum())
            sampled.append(out.responses[j, :n].tolist())
        policy = g["input_ids"][i, p:][g["response_mask"][i].bool()].tolist()
        assert policy == [t for turn in sampled for t in turn][:len(policy)]
        assert len(policy) == int(g["env_turn_len"][i].sum())
    # the trainer's forward pass on the packed rows gives the sampling log-probs of the policy tokens
    lp = LocalHandle(h.model).logprobs(g["input_ids"], g["attention_mask"])[:, p - 1:]
    m = g["response_mask"].bool()
    assert m.sum() > 0 and (~m & g["attention_mask"][:, p:].bool()).sum() > 0  # policy and observation tokens
    torch.testing.assert_close(lp[m], g["logp_old"][m], atol=2e-5, rtol=0)
    assert torch.all(g["logp_old"][~m] == 0)


def test_observation_tokens_get_no_advantage_and_no_gradient():
    cfg, b, h, ctx, g = _rollout()
    scores = score_rows(None, g, ctx, Place())
    batch = b.with_(**g.data, **scores.data)
    batch = batch.with_(scores=batch["scores"] + torch.arange(len(batch)).float())  # distinct rewards
    adv = critic_free_advantages(batch, cfg, "grpo")
    obs = ~batch["response_mask"].bool()
    assert adv.abs().sum() > 0 and torch.all(adv[obs] == 0)
    p = b["prompt_ids"].shape[1]
    logp = LocalHandle(h.model).logprobs(batch["input_ids"], batch["attention_mask"])[:, p - 1:].requires_grad_()
    mask = batch["response_mask"].float()
    loss, _ = policy_loss(logp, batch["logp_old"], adv, mask, 0.2, Norm(float(mask.sum()), float(len(mask)),
                                                                       float(mask.shape[1])))
    loss.backward()
    assert logp.grad[~obs].abs().sum() > 0 and torch.all(logp.grad[obs] == 0)
    m = rollout_metrics(batch, cfg)
    assert m["env/turns_mean"] == 3.0 and m["env/tool_calls"] == 2.0 and m["env/tool_errors"] == 1.0
    assert m["response/length"] == float(batch["response_mask"].sum(-1).float().mean())


def test_gae_skips_observation_tokens():
    # tokens: policy, policy, obs, obs, policy; score 1 at the last policy token; gamma = lam = 1
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    values = torch.tensor([[0.5, 0.25, 9.0, 9.0, 0.125]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    # with gamma = lam = 1 the advantage is the return (1) minus the token's value; obs values unused
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.75, 0.0, 0.0, 0.875]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]]))
    assert last_token_index(mask).tolist() == [4]


def test_reset_prompt_and_a_one_turn_env_equals_single_turn_generation():
    cfg, b, h, ctx, g = _rollout("PromptEnv")
    tok = ctx.tokenizer
    p = b["prompt_ids"].shape[1]
    for i in range(len(g)):
        prompt = g["input_ids"][i, :p][g["attention_mask"][i, :p].bool()].tolist()
        assert tok.decode(prompt).endswith("=") and tok.decode(prompt).lstrip(tok.decode([prompt[0]])).startswith("Q")
    # env.max_turns=1 with an env that keeps the dataset prompt: the same tokens as plain generation
    one = ["env.max_turns=1", "env.max_tokens=6"]
    cfg1, b1, h1, ctx1, g1 = _rollout("CountEnv", one)
    plain_cfg = load_settings(None, BASE)
    plain = generate_rows(LocalHandle(h1.model), b1, CallContext(plain_cfg, 0, ctx1.tokenizer), Place())
    assert torch.equal(plain["input_ids"], g1["input_ids"])
    assert torch.equal(plain["response_mask"], g1["response_mask"])
    assert g1["env_counts"][:, 3].sum() == len(g1)  # every trajectory ran out of turns: truncated


@pytest.mark.parametrize("name,msg", [
    ("Missing", "has no class 'Missing'"),
    ("NoStep", "has no method step"),
    ("BadStep", "NoStep.step|BadStep.step must be callable as step"),
])
def test_bad_env_is_refused_at_load(name, msg):
    with pytest.raises(UserError, match=msg):
        load_settings(None, BASE + [f"env.fn={ENV}:{name}"])


def test_env_errors_name_the_culprit():
    with pytest.raises(UserError, match="file nowhere.py not found"):
        load_settings(None, BASE + ["env.fn=nowhere.py:Env"])
    with pytest.raises(UserError, match="env.fn is for ppo, grpo, rloo"):
        load_settings(None, BASE + [f"env.fn={ENV}:CountEnv", "algo=remax"])
    with pytest.raises(UserError, match="env.max_tokens=4 must be >= data.gen_len=6"):
        load_settings(None, BASE + [f"env.fn={ENV}:CountEnv", "env.max_tokens=4"])
    with pytest.raises(UserError, match=r"BadReturn.*returned the reward 'one', not a finite number, on dataset row"):
        _rollout("BadReturn")


def test_a_tool_that_hangs_or_floods_becomes_an_observation():
    cfg, b, h, ctx, g = _rollout("FailingToolEnv", ["data.batch_size=1", "env.max_tokens=80"])
    assert torch.all(g["env_counts"][:, 1] == 2) and torch.all(g["env_counts"][:, 2] == 2)  # 2 calls, 2 errors
    assert torch.all(g["env_reward"] == 1.0)
    p = b["prompt_ids"].shape[1]
    obs = g["input_ids"][0, p:][(g["attention_mask"][0, p:] == 1) & (g["response_mask"][0] == 0)]
    assert "timed out after 1 s" in ctx.tokenizer.decode(obs.tolist())
