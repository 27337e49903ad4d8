"""One path: `meshrl train` without --nprocs is the runtime on one rank, in this process. It writes
every output (plan, trace, checkpoint, TensorBoard events, the HF model), `--resume` continues it
and may raise train.iterations, and its metrics equal `--nprocs 2 --plan colocated` on the same
config up to reduction order: test_plans_equal.py's bounds (rollout figures 1e-5, train-call
statistics 1e-4, relative to max(|a|, |b|, 0.1)), except the gradient norms: 1e-3, not 3e-4.

Why: this run is 6 iterations, not 3, and the weights part further with every step (each Adam step
turns summation-order noise in near-zero gradient elements into ~1e-3 lr differences;
docs/runtime.md, "Determinism"). Measured (2026-11-30, after the fix of parallel/load.py):
actor/grad_norm 2.7e-5 apart at iteration 2, 2.5e-7 at 3, 3.1e-4 at 4 (batches with one sharp
sequence); every other figure within 2.1e-6 up to iteration 3, 6.1e-6 at 4 and 1.1e-5 at 5
(actor/pg_loss); rollout figures within 2.8e-6. On main after gpustep's warm-up change (other
starting weights): gradient norms 5.8e-4, statistics 2.5e-5, rollout figures 5.0e-6. A wrong
split or a missed step moves figures by far more (one token of the 48 is 2% of a loss)."""

from __future__ import annotations

import json

import pytest

from meshrl.cli import main
from meshrl.config import load_config
from meshrl.observe.metrics import read_metrics
from oracle import one_process_metrics
from test_plans_equal import assert_same

# small, not degenerate: a warm-up and a dense reward give advantages that carry signal
ITEMS = ["data.batch_size=8", "data.gen_len=6", "sft.steps=30", "sft.batch_size=16",
         "reward.rule=numeric_distance", "ppo.mini_batches=2",
         "train.threads=1"]  # pinned: a plan test compares plans, not thread counts (docs/runtime.md)
GRAD_NORM_RTOL = 1e-3  # over 6 iterations (the module docstring); the other bounds are test_plans_equal.py's


def test_one_rank_writes_everything_resumes_and_equals_two_ranks(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *ITEMS, "train.iterations=4", "--out", str(one), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "on 1 rank" in printed and "plan:" not in printed  # the demo's console: one rank, nothing to choose
    assert json.loads((one / "plan.json").read_text())["calls"]["actor_train"]["mesh"] == "0"
    assert json.loads((one / "trace.json").read_text())["traceEvents"]
    assert (one / "ckpt-000003" / "meta.json").is_file()
    assert len(list((one / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert (one / "actor" / "model.safetensors").is_file()
    assert not list(one.glob("ckpt-00000[0-2]"))  # older checkpoints are replaced

    # the same command + --resume, with more iterations
    assert main(["train", *ITEMS, "train.iterations=6", "--out", str(one), "--no-progress", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "resuming from" in printed and "it   4" in printed and "it   0" not in printed
    assert (one / "ckpt-000005" / "meta.json").is_file()
    assert len(list((one / "tensorboard").glob("events.out.tfevents.*"))) == 2
    # nothing left to do (a job killed after its last checkpoint): the same command ends as the job would
    assert main(["train", *ITEMS, "train.iterations=6", "--out", str(one), "--resume", "--no-progress"]) == 0
    assert "raise train.iterations" in capsys.readouterr().out

    assert main(["train", *ITEMS, "train.iterations=6", "--nprocs", "2", "--plan", "colocated",
                 "--out", str(two), "--no-progress"]) == 0
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b] == list(range(6))
    assert json.loads((two / "plan.json").read_text())["calls"] != json.loads((one / "plan.json").read_text())["calls"]
    assert_same(a, b, "one rank vs 2 ranks colocated", grad_norm_rtol=GRAD_NORM_RTOL)
    assert "perf/tokens_per_s" in a[0] and "time/iteration" in a[0] and a[0]["time/iteration_cpu"] > 0


def test_a_run_from_a_checkpoint_equals_the_one_process_calls(tmp_path):
    """PPO from a checkpoint directory (actor, ref and critic all read from it): the one-rank runtime
    gives the oracle's metrics (tests/runtime/oracle.py: whole models from load_pretrained). The
    runtime's loader once gave the three roles one storage (parallel/load.py): the KL to the ref
    stayed 0 and the critic's steps moved the actor."""
    sft = tmp_path / "sft"
    assert main(["train", "algo=sft", "train.iterations=30", "data.batch_size=16", "--out", str(sft),
                 "--no-progress"]) == 0
    items = [*ITEMS, f"models.actor.path={sft / 'actor'}", "algo=ppo", "train.iterations=2"]
    assert main(["train", *items, "--out", str(tmp_path / "rl"), "--no-progress"]) == 0
    want, got = one_process_metrics(load_config(None, items)), read_metrics(tmp_path / "rl" / "metrics.jsonl")
    assert got[1]["kl/k1"] > 1e-3  # the actor has moved away from the ref
    assert_same(want, got, "from a checkpoint, one rank vs one process")  # test_plans_equal.py's bounds


@pytest.mark.parametrize("argv, message", [
    (["--nprocs", "0"], "--nprocs must be >= 1"),
    (["--nprocs", "-2"], "--nprocs must be >= 1"),
    (["--plan", " "], "unknown strategy"),
    (["--plan", "x.json"], "plan file not found"),
])
def test_bad_launch_input_is_refused_before_anything_runs(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    assert main(["train", "train.iterations=1", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (out / "metrics.jsonl").exists()
