"""A CPU profile's one-thread figures scaled to the threads a rank gets (plan/thread_scaling.py):
layer fits divided by the measured speedup of their kind, the shared-cores curve re-read for
ranks of t threads, and the planner asking for the threads the runtime will set."""

import pytest

from meshrl.plan.hardware_profile import from_profile
from meshrl.plan.thread_scaling import speedup

from .test_plan_contention import SHARED, cpu_problem

FIT = {"latency_s": 1e-3, "sec_per_unit": 1e-5}
LAYERS = {"128": {"layer_params": 1000, "head_params": 100,
                  **{k: FIT for k in ("fwd", "fwd_bwd", "decode", "fixed_fwd", "fixed_fwd_bwd", "fixed_decode")}}}
SCALING = {"speedup": {"128": {"2": {"fwd": 1.6, "fwd_bwd": 1.8, "decode": 1.2},
                               "4": {"fwd": 2.4, "fwd_bwd": 3.0, "decode": 1.4}}}}
PROFILE = {**SHARED, "cores": 4, "layers": LAYERS, "thread_scaling": SCALING,
           "contention": {"slowdown": {"1": 1.0, "2": 1.1, "4": 1.3, "8": 2.6}}}


def test_speedup_is_interpolated_between_measured_counts_and_flat_beyond():
    curve = SCALING["speedup"]["128"]
    assert speedup(curve, 1, "fwd") == 1.0
    assert speedup(curve, 2, "fwd_bwd") == 1.8
    assert speedup(curve, 3, "fwd_bwd") == pytest.approx(2.4)
    assert speedup(curve, 16, "decode") == 1.4  # more threads than cores gain nothing


def test_layer_fits_and_curve_for_two_threads_per_rank():
    one = from_profile(PROFILE, devices_per_node=2, threads=1)
    two = from_profile(PROFILE, devices_per_node=2, threads=2)
    assert one.threads == 1 and two.threads == 2
    f1, f2 = one.layer_fits(128), two.layer_fits(128)
    assert f1.fwd.latency == 1e-3 and f2.fwd.latency == pytest.approx(1e-3 / 1.6)
    assert f2.fixed_fwd_bwd.sec_per_byte == pytest.approx(1e-5 / 1.8)
    assert f2.decode.latency == pytest.approx(1e-3 / 1.2)
    assert two.flops_at(128) == pytest.approx(one.flops_at(128) * 1.8)
    # two 2-thread ranks busy = 4 threads on 4 cores: slowdown(4) / slowdown(2) of one-thread ranks
    assert two.slowdown(1) == 1.0 and two.slowdown(2) == pytest.approx(1.3 / 1.1)
    assert two.slowdown(4) == pytest.approx(2.6 / 1.1)


def test_a_profile_without_the_speedup_keeps_its_one_thread_figures():
    old = {k: v for k, v in PROFILE.items() if k != "thread_scaling"}
    hw = from_profile(old, devices_per_node=1, threads=4)
    assert hw.layer_fits(128).fwd.latency == 1e-3 and hw.threads == 4


def test_the_planner_prices_the_threads_the_runtime_sets(tmp_path, monkeypatch):
    """train.threads, else $OMP_NUM_THREADS, else the usable cores split between the ranks."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("meshrl.cores.usable_cores", lambda: 4)
    assert cpu_problem(tmp_path, PROFILE, ranks=2).hw.threads == 2
    assert cpu_problem(tmp_path, PROFILE, ranks=1).hw.threads == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu_problem(tmp_path, PROFILE, ranks=1).hw.threads == 1


def test_the_speedup_is_measured_in_the_profiles_dtype():
    """meshrl/profile/threads.py times its models in the dtype it is given (the profile's, a run's
    at train.dtype=auto: bf16 on a CPU with bf16 dot products), not in float32 whatever the run's."""
    import torch

    from meshrl.profile.threads import measure_thread_scaling

    res = measure_thread_scaling(2, quick=True, reps=1, dtype=torch.bfloat16)
    assert res["work"].endswith("in bfloat16")
    (curve,) = res["speedup"].values()
    assert set(curve) == {"2"} and all(v > 0 for v in curve["2"].values()) and set(curve["2"]) == {
        "fwd", "fwd_bwd", "decode"}
