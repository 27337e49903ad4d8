"""Plan files on the way in: a mesh may be a string ("0-3", "0,2") or a JSON list of ranks; every
error names the file and the call; a plan that still sets "async" gets one message pointing to
train.off_policy (staleness is the config's, not the plan's)."""

from __future__ import annotations

import json

import pytest

from meshrl.config import load_config
from meshrl.errors import UserError
from meshrl.plan.execution_plan import ExecutionPlan
from meshrl.runtime.plans import resolve_plan

NAMES = ["actor_gen", "reward_inf", "ref_inf", "critic_inf", "actor_train", "critic_train"]


def plan_dict(**ref_inf) -> dict:
    calls = {n: {"mesh": "0-1", "layout": "dp2tp1pp1", "micro_batches": 1} for n in NAMES}
    calls["ref_inf"].update(ref_inf)
    return {"cluster": {"nodes": 1, "devices_per_node": 2, "device": "cpu"}, "strategy": "custom", "calls": calls}


def write(tmp_path, d: dict) -> str:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    return str(path)


def test_a_mesh_may_be_a_list_of_ranks(tmp_path):
    plan = ExecutionPlan.load(write(tmp_path, plan_dict(mesh=[1, 0])))
    assert plan.calls["ref_inf"].mesh.ranks == (1, 0)
    assert plan.calls["actor_gen"].mesh.ranks == (0, 1)
    assert ExecutionPlan.from_json(plan.to_json()).calls == plan.calls  # written back as a string


@pytest.mark.parametrize("ref_inf, message", [
    ({"mesh": [0, "a"]}, "mesh must be ranks"),
    ({"mesh": []}, "mesh must be ranks"),
    ({"mesh": 3}, "mesh must be ranks"),
    ({"mesh": "0-x"}, "cannot parse mesh"),
    ({"mesh": [0, 0]}, "repeat a rank"),
    ({"mesh": [0, -1]}, "negative rank"),
    ({"layout": "dp2x"}, "cannot parse layout"),
    ({"layout": 2}, "layout must be a string"),
    ({"layout": "dp0tp1pp1"}, "positive integer"),
    ({"micro_batches": 0}, "micro_batches must be >= 1"),
    ({"micro_batches": "2"}, "micro_batches must be a whole number"),
    ({"micro_batches": True}, "micro_batches must be a whole number"),
    ({"mesh": "0", "layout": "dp2tp1pp1"}, "has 2 ranks but mesh 0 has 1"),
    ({"meshes": "0-1"}, "unknown key 'meshes'"),
])
def test_every_call_plan_error_names_the_file_and_the_call(tmp_path, ref_inf, message):
    path = write(tmp_path, plan_dict(**ref_inf))
    with pytest.raises(UserError) as e:
        ExecutionPlan.load(path)
    assert str(e.value).startswith(f"plan file {path}: call ref_inf: ") and message in str(e.value), str(e.value)


def test_async_in_a_plan_points_to_the_config(tmp_path):
    path = write(tmp_path, {**plan_dict(), "async": 1})
    with pytest.raises(UserError, match=r"'async' is no longer a plan key.*train\.off_policy=1") as e:
        ExecutionPlan.load(path)
    assert path in str(e.value)


def test_a_plan_that_does_not_fit_the_run_names_file_and_call(tmp_path):
    cfg = load_config(None, ["data.batch_size=1", "ppo.mini_batches=1"])
    path = write(tmp_path, plan_dict())
    with pytest.raises(UserError) as e:
        resolve_plan(cfg, path, 2)
    assert str(e.value).startswith(f"plan file {path}: ") and "plan call actor_gen: dp=2" in str(e.value)
    missing = plan_dict()
    del missing["calls"]["critic_inf"]
    with pytest.raises(UserError, match=r"plan file .*: plan has no entry for calls \['critic_inf'\]"):
        resolve_plan(load_config(None, []), write(tmp_path, missing), 2)


@pytest.mark.parametrize("change, message", [
    ({"keep_copys": True}, "unknown key 'keep_copys'"),
    ({"cluster": {"nodes": 1, "devices_per_node": 2, "device": "nonsense"}},
     "cluster key 'device': unknown device 'nonsense'; known devices: a100-80g, h100-80g, h200, cpu"),
    ({"cluster": {"nodes": 1, "devices_per_node": 2, "devcie": "cpu"}}, "cluster: unknown key 'devcie'"),
    ({"cluster": {"nodes": "1", "devices_per_node": 2}}, "cluster key 'nodes' must be a whole number"),
    ({"cluster": [1, 2]}, "'cluster' must be an object"),
    ({"keep_copies": "yes"}, "plan key 'keep_copies' must be true or false"),
])
def test_a_plan_file_refuses_unknown_keys_and_devices_at_every_level_by_name(tmp_path, change, message):
    """Issue 29: a typo beside "calls" (``keep_copys``) or an unknown device was ignored and the
    run trained; each is now one message naming the file and the key."""
    path = write(tmp_path, {**plan_dict(), **change})
    with pytest.raises(UserError) as e:
        ExecutionPlan.load(path)
    assert str(e.value).startswith(f"plan file {path}: ") and message in str(e.value), str(e.value)


def test_train_with_a_bad_plan_file_stops_before_any_rank_starts(tmp_path, capsys):
    """``meshrl train --plan FILE`` with the typo exits non-zero with the message and no traceback,
    before the run directory gets a metrics file."""
    from meshrl.cli import main

    path = write(tmp_path, {**plan_dict(), "cluster": {"nodes": 1, "devices_per_node": 2, "device": "nonsense"}})
    out = tmp_path / "out"
    assert main(["train", "train.iterations=1", "--nprocs", "2", "--plan", path, "--out", str(out),
                 "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert f"plan file {path}: cluster key 'device': unknown device 'nonsense'" in err and "Traceback" not in err
    assert not (out / "metrics.jsonl").exists()


def test_a_plan_is_frozen():
    """Nothing edits a loaded plan: a changed plan is a new one (dataclasses.replace)."""
    import dataclasses

    plan = ExecutionPlan.from_dict(plan_dict())
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.strategy = "edited"  # type: ignore[misc]
    assert dataclasses.replace(plan, strategy="edited").strategy == "edited" and plan.strategy == "custom"
