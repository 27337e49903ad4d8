"""train.off_policy=auto: the lag the planner chooses with the plan (meshrl/plan/lag.py), and the
steady-state score that makes lags comparable (meshrl/plan/simulator.py)."""

from __future__ import annotations

import dataclasses

import pytest

from meshrl.config import load_config
from meshrl.errors import UserError
from meshrl.plan.lag import MIN_GAIN, choose_lag, pick
from meshrl.plan.simulator import build_events, schedule, simulate
from meshrl.plan.strategies import colocated, disaggregated

from .helpers import problem
from .test_plan_simulator import PPO_16


def test_pick_takes_a_larger_lag_only_for_a_real_gain():
    assert MIN_GAIN == 0.05
    assert pick({0: 10.0, 1: 9.6, 2: 9.2, 3: 8.8}) == 2  # 9.6 is < 5% under 10; 9.2 is; 8.8 is not 5% under 9.2
    assert pick({0: 10.0, 1: 5.0, 2: 5.0, 3: 4.9}) == 1  # equal or nearly equal: the smaller lag
    assert pick({0: 1.0, 1: 1.2}) == 0
    assert pick({0: 3.0}) == 0


def test_auto_chooses_lag_and_plan_together():
    prob = problem(*PPO_16, "train.off_policy=auto", "train.off_policy_max=3")
    assert prob.off_policy == 0 and prob.off_policy_max == 3
    seen = []

    def plan_for(at_k):
        seen.append((at_k.off_policy, at_k.off_policy_max))
        return disaggregated(at_k)

    choice = choose_lag(prob, plan_for)
    assert seen == [(0, None), (1, None), (2, None), (3, None)]
    # the disaggregated plan hides generation behind training once generation runs one step ahead
    assert choice.k == 1 and choice.seconds[1] < choice.seconds[0] * (1 - MIN_GAIN)
    assert choice.gain() == pytest.approx(choice.seconds[0] / choice.seconds[1])
    assert "-> k=1" in choice.line() and "k=3" in choice.line()
    # a plan that cannot overlap (every call on every device) gains nothing from a lag: k = 0
    assert choose_lag(prob, colocated).k == 0


def test_offline_algorithms_have_no_lag_to_choose():
    prob = problem("algo=sft", "train.off_policy=auto", "cluster.devices_per_node=2")
    choice = choose_lag(prob, colocated)
    assert choice.k == 0 and list(choice.seconds) == [0]


def test_steady_state_score_leaves_lag_0_as_it_was_and_drops_the_cold_start():
    sync = problem(*PPO_16)
    plan = disaggregated(sync)
    tl = simulate(sync, plan)
    assert tl.window is None and tl.iteration_s == pytest.approx(tl.makespan / 5)
    lag2 = dataclasses.replace(sync, off_policy=2)
    tl2 = simulate(lag2, plan)
    assert len({e.iteration for e in tl2.events}) == 5 + 2 * 2  # k generations ahead before and after
    start, end = tl2.window
    ends = {e.iteration: e.end for e in tl2.events if e.kind == "end"}
    assert (start, end) == (ends[1], ends[6])
    # a run of 5 iterations from a cold start (the first 2 generations alone) is slower per iteration
    cold = schedule(build_events(lag2, plan, 5), lag2.cluster.size) / 5
    assert tl2.iteration_s < cold


def test_bad_lags_are_refused_by_name():
    for bad in ("often", "-1"):
        with pytest.raises(UserError, match="train.off_policy"):
            load_config(None, [f"train.off_policy={bad}"])
    with pytest.raises(UserError, match="train.off_policy_max"):
        load_config(None, ["train.off_policy=auto", "train.off_policy_max=-1"])
    assert load_config(None, ["train.off_policy=2"]).train.off_policy == 2
