"""Memory the planner predicts, checked: the CPU meter counts live tensor bytes exactly (hand-made
allocations), ``--validate --json`` reports predicted and measured peak memory per call on real gloo
ranks, and a plan over memory is refused before any rank starts, naming the call and the bytes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from meshrl.cli import main
from meshrl.config import load_config
from meshrl.errors import UserError
from meshrl.runtime.memory import call_peak
from meshrl.runtime.plans import resolve_plan

sys.path.insert(0, str(Path(__file__).parents[1] / "plan"))
from test_validate import PROFILE, SMALL  # noqa: E402  (the validation test's profile and sizes)


def test_cpu_meter_counts_live_bytes_by_hand():
    box: dict = {}
    held = torch.zeros(1000)  # not a role's tensor: not counted as held
    with call_peak({}, torch.device("cpu"), box):
        a = torch.ones(250_000)  # 1,000,000 bytes
        v = a[10:]  # a view: no new storage
        a.mul_(2)  # in place: no new storage
        del a, v
        b = torch.empty(500_000)  # 2,000,000 bytes, after a is gone
        c = b + 1  # 2,000,000 more while b is alive: the peak
        del b, c
    assert box["peak"] == 4_000_000
    assert held.sum() == 0


def test_a_plan_over_memory_is_refused_before_any_rank_starts():
    cfg = load_config(None, [f"models.{r}.preset=llama2-13b" for r in ("actor", "critic", "ref")]
                      + ["cluster.device=a100-80g", "cluster.devices_per_node=2"])
    with pytest.raises(UserError, match=r"plan call \w+ does not fit in memory: it needs [\d.]+ GiB \(\d+ bytes\)"):
        resolve_plan(cfg, "colocated", 2)


@pytest.mark.timeout(300)
def test_validate_json_reports_memory_per_call(capsys, tmp_path):
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    code = main(["plan", *SMALL, "--strategy", "colocated", "--profile", str(prof), "--validate",
                 "--validate-iterations", "2", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    res = json.loads(out.strip().splitlines()[-1])
    assert set(res["calls"]) == {"actor_gen", "reward_inf", "ref_inf", "critic_inf", "actor_train", "critic_train"}
    for name, c in res["calls"].items():
        assert c["predicted_s"] > 0 and c["measured_s"] > 0, name
        assert c["predicted_mem_gib"] > 0 and c["measured_mem_gib"] > 0, name
        # the tiny model's every call within 25% (the bench's median over strategies is the target)
        assert abs(c["predicted_mem_gib"] - c["measured_mem_gib"]) <= 0.25 * c["measured_mem_gib"], (name, c)
    assert res["iteration"]["measured_s"] > 0
