"""The planner prices what runs (issue 29): every setting that the runtime reads from cfg.train or
cfg.gen (found by reading meshrl/runtime, meshrl/parallel and meshrl/gen) is either priced by the
planner or named as not changing an iteration's time or memory, with the reason
(meshrl/plan/call_spec.py PRICED / UNPRICED); and each setting the estimator prices moves its
estimate of a fixed plan."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import meshrl
from meshrl.config import load_config
from meshrl.plan.call_spec import PRICED, UNPRICED
from meshrl.plan.problem import problem_from_config
from meshrl.plan.simulator import iteration_time
from meshrl.layout.mesh import Layout, Mesh
from meshrl.plan.execution_plan import CallPlan, ExecutionPlan

ROOT = Path(meshrl.__file__).parent
READ = re.compile(r"\bcfg\.(train|gen)\.(\w+)")


def runtime_keys() -> set[str]:
    """Every cfg.train.X / cfg.gen.X that the runtime, parallel and generation-backend code reads."""
    keys = set()
    for pkg in ("runtime", "parallel", "gen"):
        for path in (ROOT / pkg).rglob("*.py"):
            keys.update(f"{a}.{b}" for a, b in READ.findall(path.read_text()))
    return keys


def test_every_setting_the_runtime_reads_is_known_to_the_planner():
    keys = runtime_keys()
    assert {"train.grad_bucket_mb", "train.overlap_grad_reduce", "train.activation_checkpointing"} <= keys
    unknown = sorted(keys - set(PRICED) - set(UNPRICED))
    assert not unknown, f"runtime settings the planner neither prices nor explains: {unknown} (plan/call_spec.py)"
    assert not set(PRICED) & set(UNPRICED)


def test_the_scan_finds_a_new_key(tmp_path):
    """The reader sees a key in code written the way the runtime reads settings."""
    assert READ.findall("bucket = self.cfg.train.new_knob * 2") == [("train", "new_knob")]


BASE = ["cluster.device=a100-80g", "cluster.devices_per_node=8", "models.actor.preset=llama2-7b",
        "models.critic.preset=llama2-7b", "models.ref.preset=llama2-7b", "models.reward.preset=llama2-7b",
        "data.batch_size=8", "data.prompt_len=16", "data.gen_len=16", "train.dtype=bfloat16"]


def priced(extra: list[str]) -> tuple[float, float]:
    """(iteration seconds, the actor train call's peak memory) of one fixed plan, every call on the
    8 devices as dp 8 (so the dp settings matter), under the settings."""
    problem = problem_from_config(load_config(None, BASE + extra))
    calls = {n: CallPlan(Mesh.range(0, 8), Layout(8, 1, 1)) for n in problem.graph.names}
    plan = ExecutionPlan(problem.cluster, calls, "fixed")
    est = problem.call_estimate("actor_train", plan.calls["actor_train"])
    return iteration_time(problem, plan), est.mem_bytes


@pytest.mark.parametrize("setting, moves", [
    ("train.grad_bucket_mb=1", "time"),  # more, smaller collectives: more latencies
    ("train.grad_bucket_mb=2000", "memory"),  # ZeRO-1's gather buffer grows with the bucket
    ("train.overlap_grad_reduce=false", "time"),  # the dp all-reduce exposed
    ("train.activation_checkpointing=true data.batch_size=64 data.prompt_len=256 data.gen_len=256", "both"),
    ("train.dtype=float32", "memory"),
])
def test_each_priced_setting_moves_the_estimate(setting, moves):
    key, *sizes = setting.split()  # the setting, then the sizes it is compared at
    t0, m0 = priced(sizes)
    t1, m1 = priced([*sizes, key])
    if moves in ("time", "both"):
        assert t1 != pytest.approx(t0, rel=1e-9), setting
    if moves in ("memory", "both"):
        assert m1 != pytest.approx(m0, rel=1e-9), setting
    if key == "train.activation_checkpointing=true":
        assert t1 > t0 and m1 < m0  # less memory, a forward more
    if key == "train.overlap_grad_reduce=false":
        assert t1 > t0
