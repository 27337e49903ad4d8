"""The recipe options stay plan-invariant: GRPO and PPO with the loss variants (loss_agg, GSPO
ratio, clip_high, dual_clip), an LR schedule, a user reward function from a file, overlong shaping,
DAPO's filter_groups and evaluation give the single-process trainer's metrics on 4 gloo ranks under
the heuristic plan and a random plan with tp and pp; optim/lr follows the schedule and is the same
after a resume."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from meshrl.algo.lr_schedule import lr_factor
from meshrl.config import load_config
from meshrl.runtime.launch import RankPool
from meshrl.runtime.plans import resolve_plan
from meshrl.runtime.run import rank_main
from oracle import one_process_metrics
from runtime_util import WORLD, random_plan
from test_plans_equal import assert_same

REWARD = '''
def near(prompt, response, answer, **row):
    try:
        return max(0.0, 1.0 - abs(float(response.strip()) - float(answer)) / 10.0)
    except ValueError:
        return 0.0
'''
COMMON = ["data.gen_len=6", "sft.steps=30", "sft.batch_size=16", "train.iterations=3", "ppo.mini_batches=2",
          "optim.warmup=1", "reward.overlong_buffer=2", "eval.every=2", "eval.samples=2", "eval.correct=0.9"]
CONFIGS = {
    "grpo": ["algo=grpo", "data.batch_size=4", "data.samples_per_prompt=2", "ppo.loss_agg=seq-mean-token-mean",
             "ppo.ratio=sequence", "ppo.clip_high=0.28", "data.filter_groups=true", "data.filter_rounds=2",
             "optim.schedule=cosine"],
    "ppo": ["algo=ppo", "data.batch_size=8", "ppo.loss_agg=seq-mean-token-sum-norm", "ppo.dual_clip=3",
            "optim.schedule=linear", "optim.min_lr_ratio=0.1"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("recipes")
    (d / "near.py").write_text(REWARD)
    with open(d / "eval.jsonl", "w") as f:
        for a, b in ((1, 2), (3, 4), (5, 1), (2, 2)):
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return d


def config(algo: str, files, extra=()):
    return load_config(None, CONFIGS[algo] + COMMON + [f"reward.fn={files / 'near.py'}:near",
                                                       f"eval.path={files / 'eval.jsonl'}", *extra])


@pytest.fixture(scope="module")
def pool():
    with RankPool(WORLD, timeout=300) as p:
        yield p


def _random_tp_pp_plan(cfg):
    seed = 0
    while True:
        seed += 1
        plan = random_plan(cfg, seed)
        if {"tp", "pp"} <= {a for cp in plan.calls.values() for a in ("tp", "pp") if getattr(cp.layout, a) > 1}:
            return plan


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_recipe_options_are_plan_invariant(algo, files, pool):
    cfg = config(algo, files)
    torch.set_num_threads(1)
    want = one_process_metrics(cfg)
    plans = {"heuristic": resolve_plan(cfg, "heuristic", WORLD)[0], "random": _random_tp_pp_plan(cfg)}
    for name, plan in plans.items():
        got = pool.run(rank_main, cfg, plan, None, quiet=True)[0]
        assert_same(want, got, f"{algo}/{name}")
    per = cfg.ppo.epochs * cfg.ppo.mini_batches
    o = cfg.optim
    for rec in want:  # the LR of each iteration's first step, by the schedule's formula
        t = rec["iteration"]
        assert rec["optim/lr"] == pytest.approx(o.lr * lr_factor(t * per, 3 * per, o.schedule, 1, o.min_lr_ratio))
        assert ("eval/accuracy" in rec) == (t % 2 == 0) and ("eval/pass@2" in rec) == (t % 2 == 0)
        assert "reward/near" in rec and "reward/overlong" in rec
    if algo == "grpo":
        assert all(rec["batch/generated_groups"] == 8 and 0 <= rec["batch/kept_groups"] <= 4 for rec in want)


def test_lr_schedule_survives_resume(files, pool, tmp_path):
    """A run resumed at iteration 2 from a checkpoint of iteration 1 steps at the LR the
    uninterrupted run used (the LR is a function of the step index, the optimizer's base LR
    travels in the checkpoint)."""
    cfg = config("grpo", files, ["train.iterations=4"])
    plan = resolve_plan(cfg, "colocated", WORLD)[0]
    whole = pool.run(rank_main, cfg, plan, str(tmp_path / "whole"), quiet=True)[0]
    short = config("grpo", files, ["train.iterations=2"])  # leaves a checkpoint of iteration 1
    pool.run(rank_main, short, plan, str(tmp_path / "cut"), quiet=True)
    shutil.copy(tmp_path / "whole" / "metrics.jsonl", tmp_path / "cut" / "metrics.jsonl")
    resumed = pool.run(rank_main, cfg, plan, str(tmp_path / "cut"), start=2, quiet=True)[0]
    assert [r["iteration"] for r in resumed] == [2, 3]
    for a, b in zip(whole[2:], resumed, strict=True):
        assert a["optim/lr"] == pytest.approx(b["optim/lr"], rel=1e-12)
    assert whole[1]["optim/lr"] != whole[3]["optim/lr"]
