"""Hardware presets carry their sources; CPU numbers come only from a measured profile."""

import json
import math

import pytest

from meshrl.errors import UserError
from meshrl.plan.hardware import PRESETS
from meshrl.plan.hardware_profile import from_profile, get_hardware, load_profile

PROFILE = {"matmul": {"128": 4e10, "768": 2e10}, "mem_bw": 5e9, "mem_bytes": 8e9, "dtype_bytes": 4,
           "collectives": {"all_reduce": {"2": {"latency_s": 1e-4, "sec_per_byte": 1e-9}},
                           "p2p": {"2": {"latency_s": 5e-5, "sec_per_byte": 2e-9}}}}


def test_presets_are_cited_and_ordered():
    for name, hw in PRESETS.items():
        assert {"device", "network", "mfu", "latency"} <= set(hw.sources), name
        assert 0 < hw.mfu < 1 and hw.devices_per_node == 8
        assert hw.intra_bw > hw.inter_bw and hw.intra_lat < hw.inter_lat
    assert PRESETS["h200"].mem_bytes > PRESETS["h100-80g"].mem_bytes
    assert PRESETS["h100-80g"].peak_flops > PRESETS["a100-80g"].peak_flops


def test_ring_collectives_grow_with_bytes_and_ranks():
    hw = PRESETS["h100-80g"]
    assert hw.all_reduce(1e6, 1) == 0.0
    assert hw.all_reduce(1e6, 2) < hw.all_reduce(1e8, 2)
    assert hw.all_reduce(1e3, 2) < hw.all_reduce(1e3, 8)  # latency: more hops
    assert hw.all_reduce(1e8, 8, inter=True) > hw.all_reduce(1e8, 8)  # IB is slower than NVLink
    # Bandwidth term of a ring all-reduce: 2 (n-1)/n bytes over the link.
    big = 1e10
    assert hw.all_reduce(big, 4) == pytest.approx(2 * 3 / 4 * big / hw.intra_bw, rel=1e-3)


def test_profile_numbers_are_the_measured_ones(tmp_path):
    hw = from_profile(PROFILE, devices_per_node=2)
    assert hw.flops_at(128) == 4e10 and hw.flops_at(768) == 2e10
    assert hw.flops_at(448) == pytest.approx(3e10)  # interpolated between measured widths
    assert hw.mem_bytes == 4e9  # two ranks share the machine's memory
    assert hw.all_reduce(1000, 2) == pytest.approx(1e-4 + 1000 * 1e-9)
    assert hw.p2p(1000) == pytest.approx(5e-5 + 1000 * 2e-9)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE))
    assert load_profile(path, 1).flops_at(128) == 4e10


def test_bad_hardware_inputs_name_the_culprit(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHRL_PROFILE", str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="meshrl profile"):
        get_hardware("cpu", 1)
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        get_hardware("tpu", 1)
    with pytest.raises(UserError, match="at most 8"):
        get_hardware("h100-80g", 16)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        load_profile(bad)
    bad.write_text("{}")
    with pytest.raises(UserError, match="malformed"):
        load_profile(bad)


def test_measured_layer_costs_drive_the_cpu_estimate():
    """With per-layer fits in the profile, a call costs layers x fit + the fixed part, not FLOPs."""
    from meshrl.model.presets import get_preset
    from meshrl.layout.mesh import Layout
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call
    from meshrl.plan.model_costs import model_costs

    tiny = get_preset("tiny")
    mc = model_costs(tiny)
    fit = {"latency_s": 1e-3, "sec_per_unit": 1e-5}
    layers = {"128": {"layer_params": mc.layer_params, "head_params": mc.head_params,
                      **{k: fit for k in ("fwd", "fwd_bwd", "decode", "fixed_fwd", "fixed_fwd_bwd",
                                          "fixed_decode")}}}
    hw = from_profile({**PROFILE, "layers": layers}, devices_per_node=1)
    shape = RunShape(prompt_len=16, gen_len=16, batch_size=8)
    inf = estimate_call(CallSpec("c", "ref", "inference", tiny), shape, Layout(), 1, hw)
    tokens = 8 * 32
    expected = tiny.num_hidden_layers * (1e-3 + 1e-5 * tokens) + (1e-3 + 1e-5 * tokens)
    assert inf.time_s == pytest.approx(expected)
    gen = estimate_call(CallSpec("c", "actor", "generate", tiny), shape, Layout(), 1, hw)
    step = tiny.num_hidden_layers * (1e-3 + 1e-5 * 8) + (1e-3 + 1e-5 * 8)
    prefill = tiny.num_hidden_layers * (1e-3 + 1e-5 * 8 * 16) + (1e-3 + 1e-5 * 8)
    assert gen.time_s == pytest.approx(prefill + 15 * step)  # the prefill gives the first of the 16 tokens


def test_a_two_layer_model_timed_faster_than_one_layer_is_timed_again():
    """Noise that makes the 2-layer model look faster (a per-layer cost <= 0), or more than twice as
    slow (a fixed cost <= 0), is re-measured."""
    import time

    from meshrl.profile.layers import _layer_pair

    for first in (0.005, 0.06):  # one layer takes 20 ms; two take 5 ms, or 60 ms, in the first round
        calls = {"n": 0}

        def two_layers(first=first, calls=calls) -> None:  # its first round: warm-up + 3 reps
            calls["n"] += 1
            time.sleep(first if calls["n"] <= 4 else 0.03)

        t1, t2 = _layer_pair(lambda: time.sleep(0.02), two_layers, 3, deep=2)
        assert t1 < t2 < 2 * t1 and calls["n"] > 4


def test_a_profile_taken_with_other_threads_or_cores_is_flagged():
    """Ranks get train.threads threads (default: the usable cores split between the machine's
    ranks); a profile without the measured speedup of more threads, measured with another count,
    or one measured on another number of cores, would misprice every call: the reader says so (and
    still loads it)."""
    from meshrl.plan.hardware_profile import profile_mismatches

    data = {**PROFILE, "threads_per_rank": 1, "cores": 2}
    assert profile_mismatches(data, 1, 2) == []
    threads, = profile_mismatches(data, 4, 2)
    assert "1 thread(s) per rank" in threads and "get 4" in threads
    scaled = {**data, "thread_scaling": {"speedup": {"128": {"2": {"fwd": 1.5, "fwd_bwd": 1.5, "decode": 1.2}}}}}
    assert profile_mismatches(scaled, 2, 2) == []  # the speedup of 2 threads is measured
    cores, = profile_mismatches(data, 1, 8)
    assert "2 usable cores" in cores and "may use 8" in cores


def test_a_measured_pipeline_hop_prices_each_stage_boundary_of_each_pass():
    """Pipelined generation: the prefill and each of the gen_len - 1 decoding steps cross pp - 1
    stage boundaries; with the profile's measured hop each crossing costs it (without one, the
    token broadcast is priced as p2p messages; with pp micro-batches in flight, one p2p message of a
    micro-batch's tokens per trip: the tiny model's rounds are bound by the trip, so the whole hop
    shows)."""
    from meshrl.model.presets import get_preset
    from meshrl.layout.mesh import Layout
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call

    spec = CallSpec("g", "actor", "generate", get_preset("tiny"))
    shape = RunShape(prompt_len=16, gen_len=16, batch_size=8)
    plain = from_profile(PROFILE, devices_per_node=4)
    hop = from_profile({**PROFILE, "pipeline": {"hop_s": 0.01}}, devices_per_node=4)
    assert hop.pipeline_hop == 0.01 and plain.pipeline_hop == 0.0
    for pp in (2, 4):
        t0 = estimate_call(spec, shape, Layout(pp=pp), 1, plain).time_s
        t1 = estimate_call(spec, shape, Layout(pp=pp), 1, hop).time_s
        bcast = math.ceil(math.log2(pp)) * plain.p2p(2 * 8 * 8)
        assert t1 - t0 == pytest.approx(16 * ((pp - 1) * 0.01 - bcast))
        t0 = estimate_call(spec, shape, Layout(pp=pp), pp, plain).time_s
        t1 = estimate_call(spec, shape, Layout(pp=pp), pp, hop).time_s
        assert t1 - t0 == pytest.approx(16 * ((pp - 1) * 0.01 - plain.p2p(2 * 8 * (8 // pp))))


def test_a_measured_per_tensor_optimizer_cost_is_paid_per_tensor_of_the_stage():
    """A CPU optimizer step costs mostly per tensor (foreach=False AdamW); with the profile's
    figure every optimizer step pays it once per parameter tensor the rank holds a chunk of."""
    from meshrl.model.presets import get_preset
    from meshrl.layout.mesh import Layout
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call

    spec = CallSpec("t", "actor", "train", get_preset("tiny"))
    shape = RunShape(prompt_len=16, gen_len=16, batch_size=8, mini_batches=2)
    plain = from_profile(PROFILE, devices_per_node=4)
    per = from_profile({**PROFILE, "optimizer": {"sec_per_tensor": 1e-3}}, devices_per_node=4)
    assert per.optimizer_tensor_s == 1e-3 and plain.optimizer_tensor_s == 0.0
    for lay, tensors in ((Layout(), 8 * 9 + 3), (Layout(dp=2), 8 * 9 + 3), (Layout(pp=2), 4 * 9 + 3)):
        extra = estimate_call(spec, shape, lay, 1, per).time_s - estimate_call(spec, shape, lay, 1, plain).time_s
        assert extra == pytest.approx(2 * tensors * 1e-3)  # two optimizer steps (mini-batches)
