"""Plans change speed, never results: DP splits of a rollout call and micro-batching of a train
call give the same outputs and the same updated weights (up to float summation order). The calls
are the runtime's (meshrl/algo/calls.py) on the one-process handle."""

import copy
from pathlib import Path

import torch

from meshrl.algo import setup
from meshrl.algo.batch import Batch
from meshrl.algo.common import CallContext
from meshrl.algo.iteration import rollout_batch
from meshrl.config import load_config
from meshrl.model import build_model
from meshrl.algo.calls import Place, actor_train, generate_rows, ref_logprob_rows, score_rows
from meshrl.algo.handles import LocalHandle


def rollout(cfg, tok):
    prompts = setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg))
    ctx = CallContext(cfg, 0, tok)
    b = rollout_batch(prompts, cfg, 0)
    return b, ctx


def _gen_ref(h: LocalHandle, b: Batch, ctx: CallContext) -> Batch:
    g = generate_rows(h, b, ctx, Place())
    return g.with_(**ref_logprob_rows(h, g, ctx, Place()).data)


def test_generation_and_inference_are_invariant_to_the_dp_split():
    cfg = load_config(None, ["algo=grpo", "data.batch_size=6", "data.samples_per_prompt=2"])
    tok = setup.tokenizer_for(cfg)
    h = LocalHandle(build_model("tiny", seed=3))
    b, ctx = rollout(cfg, tok)
    whole = _gen_ref(h, b, ctx)
    merged = Batch.merge([_gen_ref(h, part, ctx) for part in b.split(4)])  # token-balanced DP split
    assert torch.equal(merged["input_ids"], whole["input_ids"])  # same tokens sampled
    assert torch.allclose(merged["logp_ref"], whole["logp_ref"], atol=1e-5)
    assert torch.allclose(merged["logp_old"], whole["logp_old"], atol=1e-5)


def test_micro_batching_changes_nothing_but_summation_order():
    base = ["algo=grpo", "data.batch_size=4", "data.samples_per_prompt=3", "ppo.mini_batches=2",
            "ppo.kl_coef=0.1", "ppo.entropy_coef=0.01"]
    cfg = load_config(None, base)
    tok = setup.tokenizer_for(cfg)
    model = build_model("tiny", seed=4)
    b, ctx = rollout(cfg, tok)
    batch = b.with_(**generate_rows(LocalHandle(model), b, ctx, Place()).data)
    batch = batch.with_(**ref_logprob_rows(LocalHandle(build_model("tiny", seed=5)), batch, ctx, Place()).data)
    batch = batch.with_(scores=torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 0, 0.5, 0, 1, 0]))
    weights, stats = [], []
    for micro in (1, 4):
        c = load_config(None, base + [f"ppo.micro_batches={micro}"])
        m = copy.deepcopy(model)
        # plain SGD: Adam divides by sqrt(v), which amplifies float noise in near-zero gradients
        h = LocalHandle(m, torch.optim.SGD(m.parameters(), lr=0.5))
        st = actor_train(h, batch, CallContext(c, 0, tok), Place(micro_batches=micro))
        weights.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
        stats.append(st)
    assert (weights[0] - torch.cat([p.detach().flatten() for p in model.parameters()])).abs().max() > 1e-5
    diff = (weights[0] - weights[1]).abs().max()
    assert diff < 1e-6, diff
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert abs(stats[0][k] - stats[1][k]) < 1e-5, k


def test_rule_reward_checks_the_decoded_answer():
    cfg = load_config(None, [])
    tok = setup.tokenizer_for(cfg)
    from meshrl.data.encode import encode_prompts, encode_sequences

    seqs = encode_sequences(tok, ["3+4=", "3+4=", "9+9="], ["7", "8", "18"], 8, 4)
    answers = encode_prompts(tok, [{"prompt": "3+4=", "answer": "7"}] * 2 + [{"prompt": "9+9=", "answer": "18"}],
                             8, 4)["answer_ids"]
    scores = score_rows(None, Batch({**seqs, "answer_ids": answers}), CallContext(cfg, 0, tok), Place())["scores"]
    assert scores.tolist() == [1.0, 0.0, 1.0]


def test_multi_turn_rollouts_are_invariant_to_the_dp_split():
    """A multi-turn GRPO rollout (tests/algo/count_env.py, 3 turns, observations between them): the
    trajectories of a 3-way token-balanced split, merged, are the whole batch's, token for token;
    the environment's rewards and counts too, and the reference's log-probs up to summation order."""
    env = f"env.fn={Path(__file__).with_name('count_env.py')}:CountEnv"
    cfg = load_config(None, ["algo=grpo", "data.batch_size=6", "data.samples_per_prompt=2", "data.gen_len=6",
                             env, "env.max_turns=3", "env.max_tokens=24"])
    tok = setup.tokenizer_for(cfg)
    h = LocalHandle(build_model("tiny", seed=3))
    b, ctx = rollout(cfg, tok)
    whole = _gen_ref(h, b, ctx)
    merged = Batch.merge([_gen_ref(h, part, ctx) for part in b.split(3)])
    assert whole["env_counts"][:, 4].sum() > 0  # observations were rendered into the trajectories
    for key in ("input_ids", "attention_mask", "response_mask", "env_counts", "env_turn_len", "env_reward"):
        assert torch.equal(merged[key], whole[key]), key
    assert torch.allclose(merged["logp_ref"], whole["logp_ref"], atol=1e-5)
    assert torch.allclose(merged["logp_old"], whole["logp_old"], atol=1e-5)
