"""``train.off_policy=auto`` in a run: the lag is chosen with the plan when the run starts, written
to OUT/config.yaml, logged, and kept on --resume (the lag changes the numbers; re-planning never
does), so a run stopped and resumed under auto ends with the uninterrupted run's weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from meshrl.config import dump_yaml, load_config
from meshrl.runtime.checkpoint import ShardReader
from meshrl.runtime.job import prepare

ARGS = ["algo=ppo", "data.batch_size=4", "data.gen_len=4", "sft.steps=2", "sft.batch_size=8", "train.save_every=1",
        "train.off_policy=auto", "--nprocs", "2", "--plan", "disaggregated", "--no-progress"]


def _train(out: Path, *extra: str, fault: str | None = None) -> str:
    env = {**os.environ, **({"MESHRL_FAULT": fault} if fault else {})}
    proc = subprocess.run([sys.executable, "-m", "meshrl.cli", "train", *ARGS, "train.iterations=3", *extra,
                           "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == (1 if fault else 0), proc.stdout + proc.stderr
    return proc.stdout


def _weights(out: Path) -> dict[str, torch.Tensor]:
    reader = ShardReader(sorted(out.glob("ckpt-*"))[-1])
    return {k: reader.full(k) for k in reader.index["tensors"]}


def test_auto_lag_is_chosen_recorded_and_kept_across_resume(tmp_path):
    whole = _train(tmp_path / "whole")
    assert "train.off_policy=auto (lags 0..4" in whole and "-> k=1" in whole, whole
    saved = yaml.safe_load((tmp_path / "whole" / "config.yaml").read_text())["train"]
    assert saved["off_policy"] == 1 and saved["off_policy_max"] == 4
    records = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/staleness_max"] for r in records] == [0.0, 1.0, 1.0]  # generated one update behind
    _train(tmp_path / "cut", fault="0:actor_train@2")  # rank 0 dies in the last iteration's update
    assert sorted(p.name for p in (tmp_path / "cut").glob("ckpt-*")) == ["ckpt-000001"]
    again = _train(tmp_path / "cut", "--resume")
    assert "train.off_policy=auto (lags" not in again  # not chosen again: the run's own lag
    want, got = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_resume_reads_the_lag_the_run_chose_not_a_new_one(tmp_path):
    cfg = load_config(None, ["algo=ppo", "data.batch_size=4", "train.off_policy=auto"])
    plan, start, chosen = prepare(cfg, "disaggregated", 2, tmp_path, resume=False, quiet=True)
    assert chosen.train.off_policy == 1 and start == 0
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["off_policy"] == 1
    # a run whose start chose 3 (another machine's costs, say) resumes at 3, whatever the planner says now
    (tmp_path / "config.yaml").write_text(dump_yaml(load_config(None, ["algo=ppo", "data.batch_size=4",
                                                                       "train.off_policy=3"])))
    _, _, resumed = prepare(cfg, "disaggregated", 2, tmp_path, resume=True, quiet=True)
    assert resumed.train.off_policy == 3
