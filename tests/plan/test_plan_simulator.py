"""The simulator: dependencies, one step per device at a time, asynchronous overlap, exports."""

import json

from meshrl.layout.mesh import Layout, Mesh
from meshrl.plan.execution_plan import CallPlan, ExecutionPlan
from meshrl.plan.simulator import simulate
from meshrl.plan.strategies import BUILDERS, colocated, disaggregated

from .helpers import models, problem

PPO_16 = ("cluster.nodes=2", "cluster.devices_per_node=8", *models("llama2-7b"), "data.gen_len=384",
          "data.batch_size=256")


def check_timeline(prob, tl):
    ends = [e.end for e in tl.events]
    for e in tl.events:
        assert e.end >= e.start >= 0
        for d in e.deps:
            assert tl.events[d].end <= e.start + 1e-12, (e.name, tl.events[d].name)
    by_device: dict[int, list] = {}
    for e in tl.events:
        for d in e.devices:
            by_device.setdefault(d, []).append((e.start, e.end))
    for spans in by_device.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-12  # one step at a time per device
    assert max(ends) == tl.makespan


def test_every_strategy_schedules_consistently():
    prob = problem(*PPO_16)
    for build in BUILDERS.values():
        tl = simulate(prob, build(prob))
        check_timeline(prob, tl)
        names = {e.name for e in tl.events if e.kind == "call"}
        assert names == set(prob.graph.names)


def test_a_call_waits_for_its_parents_and_the_shadow_refresh():
    prob = problem(*PPO_16)
    plan = disaggregated(prob)
    tl = simulate(prob, plan, iterations=2)
    ev = {(e.name, e.iteration): e for e in tl.events}
    assert ev[("reward_inf", 0)].start >= ev[("actor_gen", 0)].end
    assert ev[("actor_train", 0)].start >= ev[("critic_inf", 0)].end
    refresh = ev[("realloc actor->actor_gen", 1)]  # the shadow actor, refreshed after the update
    assert refresh.start >= ev[("actor_train", 0)].end
    assert ev[("actor_gen", 1)].start >= refresh.end


def test_off_policy_generation_overlaps_training():
    sync = problem(*PPO_16)
    asy = problem(*PPO_16, off_policy=1)
    plan = disaggregated(sync)
    t_sync = simulate(sync, plan).iteration_s
    tl = simulate(asy, plan)
    check_timeline(asy, tl)
    assert tl.iteration_s < t_sync
    ev = {(e.name, e.iteration): e for e in tl.events}
    # generation of iteration 2 runs while iteration 1 trains
    assert ev[("actor_gen", 2)].start < ev[("actor_train", 1)].end


def test_disjoint_meshes_run_at_the_same_time():
    prob = problem("cluster.devices_per_node=2", "algo=grpo", *models("qwen2.5-0.5b"), "data.gen_len=64",
                   "data.batch_size=16")
    one, two = Mesh.range(0, 1), Mesh.range(1, 1)
    plan = ExecutionPlan(prob.cluster, {"actor_gen": CallPlan(one, Layout()), "reward_inf": CallPlan(one, Layout()),
                                        "ref_inf": CallPlan(two, Layout()), "actor_train": CallPlan(one, Layout())})
    tl = simulate(prob, plan, iterations=1)
    ev = {e.name: e for e in tl.events}
    assert ev["ref_inf"].start < ev["reward_inf"].end and ev["reward_inf"].start < ev["ref_inf"].end


def test_trace_and_gantt(tmp_path):
    prob = problem(*PPO_16)
    tl = simulate(prob, colocated(prob))
    trace = json.loads(json.dumps(tl.to_chrome_trace()))
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in xs} == set(range(16))
    assert all(e["dur"] >= 0 for e in xs)
    png = tmp_path / "g.png"
    tl.save_gantt(str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_no_step_of_the_next_iteration_starts_before_every_rank_ends_this_one():
    """The runtime's ranks meet at the end of every iteration (statistics to rank 0 by gather_object),
    so a synchronous plan's iteration t+1 starts after all of iteration t, even on disjoint meshes
    (interleaved with a larger critic: the actor's half would otherwise generate t+1 while the
    critic's half still trains on t)."""
    prob = problem("cluster.nodes=2", "cluster.devices_per_node=8", *models("llama2-7b", "llama2-13b"),
                   "data.gen_len=128", "data.batch_size=256")
    for build in BUILDERS.values():
        tl = simulate(prob, build(prob), iterations=3)
        check_timeline(prob, tl)
        for t in (1, 2):
            prev_end = max(e.end for e in tl.events if e.iteration == t - 1)
            assert min(e.start for e in tl.events if e.iteration == t) >= prev_end - 1e-12
        assert sum(e.kind == "end" for e in tl.events) == 3
