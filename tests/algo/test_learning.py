"""The demo learns: PPO and GRPO raise reward/mean, and the reward model ranks held-out pairs.

One SFT checkpoint (the demo's 150 noisy SFT steps) is trained once and shared by all three tests.

Margins (measured; docs/algorithms.md, "Learning tests"): a test compares the mean reward/mean of
the last K = 10 iterations with that of the first 10. Iteration-to-iteration noise of reward/mean,
measured as std(r[t+1] - r[t]) / sqrt(2) over whole runs, is about 0.06 for PPO (64 prompts) and
0.05 for GRPO (32 prompts x 4 samples); the difference of two 10-iteration means therefore has a
noise std of 0.06 * sqrt(2 / 10) = 0.027 (PPO) and 0.022 (GRPO). Each margin is about 3 of those
stds, and below the smallest rise measured over seeds 1, 2, 3.

The reward model's held-out set is 400 pairs whose rejected answers miss by 3, never seen in
training (training pairs miss by 1 or 2). At chance, accuracy on 400 pairs has a std of 0.025;
at 0.95 its standard error is 0.011.
"""

import pytest

from meshrl.cli import main
from meshrl.observe.metrics import read_metrics

SFT_STEPS = 150
K = 10  # iterations averaged at each end
PPO_ITERS, PPO_MARGIN = 40, 0.08  # rises measured for seeds 1, 2, 3: 0.208, 0.220, 0.141
GRPO_ITERS, GRPO_MARGIN = 40, 0.08  # rises measured for seeds 1, 2, 3: 0.202, 0.177, 0.249
# Reward model: random score head at 10x the backbone's lr (meshrl/algo/setup.py), 64 pairs per step.
# Held-out accuracy swings +-0.05 from one evaluation to the next, and summation order moves a run
# across that range (the padding-free projections of 2026-11-30 turned seed 1's last evaluation from
# 0.993 into 0.797), so the mean of the last five evaluations (iterations 260..299) is asserted.
# Measured after that change, seeds 1, 2, 3: 0.787 (1 thread; 0.902 with 2), 0.998, 0.796.
RM_STEPS, RM_MIN_ACC, RM_LAST = 300, 0.75, 5  # below the smallest of them; chance + 10 stds


@pytest.fixture(scope="module")
def sft_actor(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    assert main(["train", "algo=sft", f"train.iterations={SFT_STEPS}", "data.batch_size=64", "--out", str(out),
                 "--no-progress"]) == 0
    return out / "actor"


def rise(tmp_path, actor, *items) -> tuple[float, list[float]]:
    out = tmp_path / "rl"
    assert main(["train", f"models.actor.path={actor}", *items, "--out", str(out), "--no-progress"]) == 0
    r = [m["reward/mean"] for m in read_metrics(out / "metrics.jsonl")]
    return sum(r[-K:]) / K - sum(r[:K]) / K, r


def test_ppo_raises_the_demo_reward(tmp_path, sft_actor):
    gain, curve = rise(tmp_path, sft_actor, "algo=ppo", "data.batch_size=64", f"train.iterations={PPO_ITERS}",
                       "train.seed=1")
    assert gain > PPO_MARGIN, curve


def test_grpo_raises_the_demo_reward(tmp_path, sft_actor):
    gain, curve = rise(tmp_path, sft_actor, "algo=grpo", "data.batch_size=32", f"train.iterations={GRPO_ITERS}",
                       "train.seed=1")
    assert gain > GRPO_MARGIN, curve


def test_reward_model_ranks_held_out_pairs(tmp_path, sft_actor):
    out = tmp_path / "rm"
    assert main(["train", "algo=rm", f"models.actor.path={sft_actor}", f"train.iterations={RM_STEPS}",
                 "data.batch_size=64", "--out", str(out), "--no-progress"]) == 0
    accs = [r["rm/heldout_accuracy"] for r in read_metrics(out / "metrics.jsonl") if "rm/heldout_accuracy" in r]
    assert len(accs) >= RM_LAST and sum(accs[-RM_LAST:]) / RM_LAST > RM_MIN_ACC, accs
