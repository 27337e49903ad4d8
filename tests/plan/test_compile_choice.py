"""train.compile / gen.compile = auto (meshrl/plan/compile_choice.py): on only where the predicted
saving over the run's iterations exceeds the measured compile time; eager where nothing measured."""

from __future__ import annotations

import dataclasses

import pytest

from meshrl.plan.compile_choice import choose_compile, with_setting
from meshrl.plan.hardware import CompileSpeed
from meshrl.plan.simulator import iteration_time
from meshrl.plan.strategies import build

from .helpers import models, problem

TINY = ("cluster.devices_per_node=1", *models("tiny"), "data.gen_len=16", "data.batch_size=8")
MEASURED = CompileSpeed(fwd=0.8, fwd_bwd=0.9, decode=0.5, compile_s=(("decode", 30.0), ("fwd", 5.0), ("fwd_bwd", 15.0)))


def measured_problem(speed: CompileSpeed = MEASURED):
    p = problem(*TINY)
    return dataclasses.replace(p, hw=dataclasses.replace(p.hw, compiled=speed))


def test_nothing_measured_stays_eager_and_says_why():
    p = problem(*TINY)  # a GPU preset: compile factors 1, no compile times
    plan = build(p, "colocated")
    c = choose_compile(p, plan, 10_000, "auto", "auto")
    assert (c.train, c.gen) == (False, False)
    assert "no measurement of torch.compile on h100-80g" in c.line()
    c = choose_compile(p, plan, 10_000, "auto", "auto", unmeasured="no profile")
    assert "no profile" in c.line()


def test_explicit_settings_are_kept():
    p = measured_problem()
    plan = build(p, "colocated")
    assert (lambda c: (c.train, c.gen))(choose_compile(p, plan, 1, True, False)) == (True, False)
    assert (lambda c: (c.train, c.gen))(choose_compile(problem(*TINY), plan, 1, False, True)) == (False, True)


@pytest.mark.parametrize("kind", ["train", "gen"])
def test_on_exactly_when_the_run_saves_more_than_the_compile_costs(kind):
    p = measured_problem()
    plan = build(p, "colocated")
    base = with_setting(with_setting(p, "train", False), "gen", False)
    per_iteration = iteration_time(base, plan) - iteration_time(with_setting(base, kind, True), plan)
    assert per_iteration > 0  # a factor below 1 makes the calls it touches faster
    cost = {"train": 20.0, "gen": 30.0}[kind]
    even = cost / per_iteration  # iterations at which the saving equals the compile
    args = {"train": "auto", "gen": False} if kind == "train" else {"train": False, "gen": "auto"}
    short = choose_compile(p, plan, int(even * 0.9), **args)
    long = choose_compile(p, plan, int(even * 1.1) + 1, **args)
    assert getattr(short, kind) is False and "not worth it" in short.line()
    assert getattr(long, kind) is True
    assert long.saved_s[kind] == pytest.approx(per_iteration * (int(even * 1.1) + 1))
    assert long.cost_s[kind] == cost


def test_a_profile_without_compile_times_stays_eager():
    p = measured_problem(dataclasses.replace(MEASURED, compile_s=()))
    c = choose_compile(p, build(p, "colocated"), 10**9, "auto", "auto")
    assert (c.train, c.gen) == (False, False) and "no measurement" in c.line()
