"""Every strategy builds a valid plan of the shape its name promises."""

import pytest

from meshrl.plan.execution_plan import ExecutionPlan
from meshrl.plan.strategies import BUILDERS, colocated, disaggregated, heuristic, interleaved

from .helpers import models, problem


@pytest.fixture(scope="module")
def prob():
    return problem("cluster.nodes=4", "cluster.devices_per_node=8", *models("llama2-13b", "llama2-7b"),
                   "data.gen_len=384", "data.batch_size=256")


def test_all_valid_and_round_trip(prob):
    for name, build in BUILDERS.items():
        plan = build(prob)
        assert plan.strategy == name
        roles = {c.name: c.role for c in prob.graph.calls}
        dims = {r: (m.num_attention_heads, m.num_hidden_layers) for r, m in prob.models.items()}
        plan.validate(prob.graph.names, dims, roles)
        assert prob.feasible(plan), name
        assert ExecutionPlan.from_json(plan.to_json()).to_dict() == plan.to_dict()


def test_shapes(prob):
    everything = set(range(32))
    col = colocated(prob)
    assert all(set(cp.mesh.ranks) == everything for cp in col.calls.values())
    assert len({cp.layout for cp in col.calls.values()}) == 1
    inter = interleaved(prob)
    a = {inter.calls[n].mesh for n in ("actor_gen", "ref_inf", "actor_train")}
    b = {inter.calls[n].mesh for n in ("reward_inf", "critic_inf", "critic_train")}
    assert len(a) == len(b) == 1 and not a.pop().overlaps(b.pop())
    dis = disaggregated(prob)
    gen = dis.calls["actor_gen"].mesh
    assert all(not gen.overlaps(cp.mesh) for n, cp in dis.calls.items() if n != "actor_gen")
    heu = heuristic(prob)
    lay = heu.calls["actor_train"].layout
    assert lay.tp == 8 and lay.size == 32 and len({cp.layout for cp in heu.calls.values()}) == 1


def test_micro_batches_are_raised_until_the_plan_fits():
    prob = problem("cluster.devices_per_node=8", *models("llama2-13b", "llama2-7b"), "data.gen_len=896",
                   "data.batch_size=128")
    plan = colocated(prob)
    assert prob.feasible(plan)
    assert max(cp.micro_batches for cp in plan.calls.values()) > 1


@pytest.mark.parametrize("algo", ["sft", "rm", "dpo", "remax", "grpo"])
def test_every_algorithm_gets_every_strategy(algo):
    prob = problem("cluster.devices_per_node=4", f"algo={algo}", *models("qwen2.5-0.5b"), "data.gen_len=64",
                   "data.batch_size=16")
    for name, build in BUILDERS.items():
        plan = build(prob)
        assert plan.strategy == name and set(plan.calls) == set(prob.graph.names)
