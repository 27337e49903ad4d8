"""Ranks that share a node's cores: the measured slowdown curve, and the simulator that stretches
steps running at the same time on one node by it. GPU presets have no curve and are unchanged."""

import pytest

from meshrl.plan.hardware import PRESETS
from meshrl.plan.hardware_profile import from_profile
from meshrl.plan.simulator import Event, Sharing, build_events, schedule, sharing, simulate
from meshrl.plan.strategies import BUILDERS, colocated, interleaved

from .helpers import models, problem
from .test_plan_simulator import PPO_16, check_timeline
from .test_validate import PROFILE

# A 2-core machine: two busy ranks run as fast as one, four take about twice as long.
CURVE = {"1": 1.0, "2": 1.05, "3": 1.6, "4": 2.1}
SHARED = {**PROFILE, "cores": 2, "threads_per_rank": 1, "contention": {"slowdown": CURVE}}


def cpu_problem(tmp_path, profile: dict, ranks: int = 4):
    import json

    from meshrl.commands.train import DEMO_DEFAULTS
    from meshrl.config import load_config
    from meshrl.plan.problem import problem_from_config

    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    cfg = load_config(None, DEMO_DEFAULTS["ppo"] + ["cluster.device=cpu", f"cluster.devices_per_node={ranks}"])
    return problem_from_config(cfg, str(path))


def test_slowdown_is_the_measured_curve_made_physical():
    hw = from_profile(SHARED, devices_per_node=4)
    assert hw.cores == 2
    assert [hw.slowdown(k) for k in (0, 1, 2, 3, 4)] == [1.0, 1.0, 1.05, 1.6, 2.1]
    assert hw.slowdown(8) == pytest.approx(2.1 * 2)  # processor sharing beyond the measured points
    noisy = from_profile({**SHARED, "contention": {"slowdown": {"1": 1.0, "2": 0.97, "3": 1.9, "4": 1.8}}}, 4)
    assert [noisy.slowdown(k) for k in (2, 3, 4)] == [1.0, 1.9, 1.9]  # >= 1 and non-decreasing
    old = from_profile(PROFILE, devices_per_node=4)  # a profile from before the curve was measured
    assert old.contention == () and old.slowdown(4) == 1.0
    assert all(hw.slowdown(64) == 1.0 for hw in PRESETS.values())


def test_two_steps_on_one_node_share_its_cores():
    """Two steps of two ranks each on a 4-rank node: both at 1 / slowdown(4) until the shorter ends,
    then the longer at 1 / slowdown(2). On two nodes of two ranks neither slows the other."""
    curve = {2: 1.0, 4: 2.0}

    def events():
        return [Event("a", "call", 0, (0, 1), 1.0), Event("b", "call", 0, (2, 3), 2.0),
                Event("c", "call", 0, (0, 1, 2, 3), 1.0, (0, 1))]

    one_node = events()
    assert schedule(one_node, 4, Sharing(4, curve.get)) == pytest.approx(3.0 + 2.0)
    assert (one_node[0].end, one_node[1].end) == pytest.approx((2.0, 3.0))  # a: 1 s of work at half speed
    two_nodes = events()
    assert schedule(two_nodes, 4, Sharing(2, curve.get)) == pytest.approx(2.0 + 1.0)


def test_shared_schedule_without_slowdown_is_the_list_schedule():
    """With a flat curve the event-by-event simulation gives the plain list schedule, step by step."""
    prob = problem(*PPO_16)
    for build in BUILDERS.values():
        plain = build_events(prob, build(prob), 3)
        shared = build_events(prob, build(prob), 3)
        assert schedule(shared, prob.cluster.size, Sharing(8, lambda k: 1.0)) == pytest.approx(
            schedule(plain, prob.cluster.size))
        for p, s in zip(plain, shared, strict=True):
            assert (s.start, s.end) == pytest.approx((p.start, p.end), abs=1e-9)


def test_gpu_presets_model_no_sharing():
    for device in PRESETS:
        prob = problem("cluster.devices_per_node=8", *models("llama2-7b"), device=device)
        assert sharing(prob) is None


def test_four_busy_ranks_on_two_cores_take_at_least_the_measured_factor(tmp_path):
    """Colocated on 4 ranks: every step runs on all 4 ranks of the 2-core node, so each takes
    slowdown(4) = 2.1 times its time alone; but pipelined generation with one micro-batch, whose
    stages take turns, keeps about one rank busy of its pp (with pp 2: 2 of its 4 ranks; a little
    less: the tokens' trips back)."""
    from dataclasses import replace

    from meshrl.layout.mesh import Layout

    shared = cpu_problem(tmp_path, SHARED)
    alone = cpu_problem(tmp_path, PROFILE)
    base = colocated(alone)
    piped = replace(base, calls={**base.calls, "actor_gen": replace(base.calls["actor_gen"],
                                                                    layout=Layout(dp=2, pp=2))})
    for plan in (base, piped):
        tl, tl0 = simulate(shared, plan), simulate(alone, plan)
        check_timeline(shared, tl)
        gen_pp = plan.calls["actor_gen"].layout.pp
        active = shared.call_estimate("actor_gen", plan.calls["actor_gen"]).active
        assert active == 1.0 if gen_pp == 1 else 0.8 / gen_pp < active <= 1 / gen_pp
        for e in tl.events:
            if e.kind == "call" and e.devices:
                factor = shared.hw.slowdown(4 * active) if e.name == "actor_gen" else 2.1
                assert e.end - e.start == pytest.approx(e.duration * factor)
        assert tl0.iteration_s * 1.5 < tl.iteration_s <= tl0.iteration_s * 2.1 * (1 + 1e-9)


def test_interleaved_halves_slow_each_other_only_while_both_compute(tmp_path):
    shared = cpu_problem(tmp_path, SHARED)
    alone = cpu_problem(tmp_path, PROFILE)
    plan = interleaved(alone)
    tl, tl0 = simulate(shared, plan), simulate(alone, plan)
    check_timeline(shared, tl)
    spans = [(e.end - e.start) / e.duration for e in tl.events if e.kind == "call" and e.duration > 0 and e.devices]
    assert all(1.05 - 1e-9 <= s <= 2.1 + 1e-9 for s in spans)  # between slowdown(2) and slowdown(4)
    assert max(spans) > 1.5 and 1.05 * tl0.iteration_s < tl.iteration_s < 2.1 * tl0.iteration_s


def test_validate_predicts_each_call_as_run(tmp_path):
    """`meshrl plan --validate` compares a call's measured time with its simulated time as run."""
    from meshrl.plan.validate import predicted_steps, steady_iteration_s

    shared = cpu_problem(tmp_path, SHARED)
    alone = cpu_problem(tmp_path, PROFILE)
    plan = colocated(alone)
    pred, pred0 = predicted_steps(shared, plan), predicted_steps(alone, plan)
    for name, cp in plan.calls.items():
        est = alone.call_estimate(name, cp)
        assert pred0[name][1] == pytest.approx(est.time_s)
        assert pred[name][1] == pytest.approx(pred0[name][1] * shared.hw.slowdown(4 * est.active))
    assert 1.5 < steady_iteration_s(shared, plan) / steady_iteration_s(alone, plan) <= 2.1 * (1 + 1e-9)


def test_a_pipeline_keeps_busy_only_the_stages_outside_its_bubble(tmp_path):
    """pp 4 with one micro-batch: the stages take turns, one rank computes at a time, so nothing is
    stretched; with m micro-batches each stage works m of the m + 3 stage steps. Generation with
    one micro-batch keeps about one stage of 4 busy; with 4 in flight (parallel/generate_micro.py)
    more, less than all (the tokens' trips back)."""
    from dataclasses import replace

    from meshrl.layout.mesh import Layout

    shared = cpu_problem(tmp_path, SHARED)
    base = colocated(cpu_problem(tmp_path, PROFILE))
    gen_share = []
    for m in (1, 4):
        calls = {n: replace(cp, layout=Layout(pp=4), micro_batches=m) for n, cp in base.calls.items()}
        plan = replace(base, calls=calls)
        for e in simulate(shared, plan).events:
            if e.kind == "call" and e.devices:
                est = shared.call_estimate(e.name, plan.calls[e.name])
                share = est.active if e.name == "actor_gen" else m / (m + 3)
                if e.name == "actor_gen":
                    assert 0.8 / 4 < share <= 1 / 4 if m == 1 else 1 / 4 < share < 1
                    gen_share.append(share)
                assert est.active == pytest.approx(share)
                assert e.end - e.start == pytest.approx(e.duration * shared.hw.slowdown(4 * share))
    assert gen_share[0] < gen_share[-1]
