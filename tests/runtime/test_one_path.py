"""One path: `meshrl train` without --nprocs is the runtime on one rank, in this process. It writes
every output (plan, trace, checkpoint, TensorBoard events, the HF model), `--resume` continues it
and may raise train.iterations, and its metrics equal `--nprocs 2 --plan colocated` on the same
config. That comparison runs in float64 (train.dtype=float64: the whole pipeline, communication
included), where the only differences left are the order of the sums, so it holds to 1e-9
relative to max(|a|, |b|, 0.1) over all 6 iterations (measured worst: test_float64_exact.py's
order, ~1e-11); in float32 Adam's steps turn that order's noise into differences of 1e-5 .. 1e-3
(test_plans_equal.py), which no tight bound survives. A wrong split or a missed step moves figures
by far more (one token of the 48 is 2% of a loss). The run from a checkpoint is compared in float32
with the oracle, within test_plans_equal.py's bounds."""

from __future__ import annotations

import json

import pytest

from meshrl.cli import main
from meshrl.config import load_config
from meshrl.observe.metrics import read_metrics
from oracle import one_process_metrics
from test_float64_exact import worst_diff
from test_plans_equal import assert_same

# small, not degenerate: a warm-up and a dense reward give advantages that carry signal
ITEMS = ["data.batch_size=8", "data.gen_len=6", "sft.steps=30", "sft.batch_size=16",
         "reward.rule=numeric_distance", "ppo.mini_batches=2",
         "train.threads=1"]  # pinned: a plan test compares plans, not thread counts (docs/runtime.md)
EXACT = ["train.dtype=float64"]  # the one-rank vs two-rank comparison (module docstring)


def test_one_rank_writes_everything_resumes_and_equals_two_ranks(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *ITEMS, *EXACT, "train.iterations=4", "--out", str(one), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "on 1 rank" in printed and "plan:" not in printed  # the demo's console: one rank, nothing to choose
    assert json.loads((one / "plan.json").read_text())["calls"]["actor_train"]["mesh"] == "0"
    assert json.loads((one / "trace.json").read_text())["traceEvents"]
    assert (one / "ckpt-000003" / "meta.json").is_file()
    assert len(list((one / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert (one / "actor" / "model.safetensors").is_file()
    assert not list(one.glob("ckpt-00000[0-2]"))  # older checkpoints are replaced

    # the same command + --resume, with more iterations
    assert main(["train", *ITEMS, *EXACT, "train.iterations=6", "--out", str(one), "--no-progress", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "resuming from" in printed and "it   4" in printed and "it   0" not in printed
    assert (one / "ckpt-000005" / "meta.json").is_file()
    assert len(list((one / "tensorboard").glob("events.out.tfevents.*"))) == 2
    # nothing left to do (a job killed after its last checkpoint): the same command ends as the job would
    assert main(["train", *ITEMS, *EXACT, "train.iterations=6", "--out", str(one), "--resume", "--no-progress"]) == 0
    assert "raise train.iterations" in capsys.readouterr().out

    assert main(["train", *ITEMS, *EXACT, "train.iterations=6", "--nprocs", "2", "--plan", "colocated",
                 "--out", str(two), "--no-progress"]) == 0
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b] == list(range(6))
    assert json.loads((two / "plan.json").read_text())["calls"] != json.loads((one / "plan.json").read_text())["calls"]
    worst, where = worst_diff(a, b)
    print(f"one rank vs 2 ranks colocated, float64: worst scaled difference {worst:.1e} ({where})")
    assert worst <= 1e-9, where
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
