"""The search is reproducible (issue 18, item 5): its budget is counted in plan evaluations, so a
seed and a step count give the same plan on any machine, at any load, in any process; wall time
is only an optional cap."""

import json
import os
import subprocess
import sys

from meshrl.cli import main
from meshrl.plan.search import search

from .helpers import models, problem

ARGS = ["cluster.device=h100-80g", "cluster.nodes=2", "cluster.devices_per_node=8", "algo=grpo",
        *models("llama2-13b", "llama2-7b"), "data.gen_len=256", "data.batch_size=64"]


def plan_in_fresh_process(hash_seed: str, *extra: str) -> dict:
    """`meshrl plan --json` in a new interpreter with its own string-hash seed (set iteration order)."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-m", "meshrl.cli", "plan", *ARGS, "--strategy", "search", "--json",
                          "--steps", "400", *extra], capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out)["strategies"]["search"]


def test_same_seed_and_steps_same_plan_in_any_process():
    a, b = plan_in_fresh_process("1"), plan_in_fresh_process("2")
    assert a["plan"] == b["plan"] and a["iteration_s"] == b["iteration_s"]


def test_the_budget_is_steps_not_seconds():
    prob = problem(*ARGS)
    slow = search(prob, steps=300, seed=3)
    assert slow.evaluations == 300
    # an evaluation budget does not depend on speed: a second run (warm caches, faster) agrees
    again = search(prob, steps=300, seed=3)
    assert again.plan == slow.plan and again.evaluations == 300
    capped = search(prob, steps=10**9, seed=3, time_limit_s=0.2)  # the optional wall-clock cap
    assert capped.evaluations < 10**9 and capped.seconds < 30


def test_plan_cli_takes_steps_and_an_optional_time_limit(capsys):
    assert main(["plan", *ARGS, "--strategy", "search", "--json", "--steps", "50", "--time-limit", "60"]) == 0
    assert json.loads(capsys.readouterr().out)["strategies"]["search"]["feasible"]
