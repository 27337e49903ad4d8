"""The estimator: monotone where it must be, memory sharded the way the layouts shard it."""

import pytest

from meshrl.model.presets import get_preset
from meshrl.layout.mesh import Layout
from meshrl.plan.estimator import CallSpec, Links, RunShape, estimate_call
from meshrl.plan.hardware import PRESETS
from meshrl.plan.model_costs import model_costs

H100 = PRESETS["h100-80g"]
SEVEN = get_preset("llama2-7b")
SHAPE = RunShape(prompt_len=128, gen_len=384, batch_size=256)


def est(kind, layout=None, m=1, shape=SHAPE, model=SEVEN, links=None):
    return estimate_call(CallSpec("c", "actor", kind, model), shape, layout or Layout(), m, H100, links or Links())


def test_parameter_count_matches_the_model():
    assert model_costs(SEVEN).total_params == pytest.approx(6.74e9, rel=0.01)


@pytest.mark.parametrize("kind", ["generate", "inference", "train"])
def test_time_grows_with_tokens(kind):
    small = RunShape(128, 128, 64)
    assert est(kind, shape=small).time_s < est(kind, shape=RunShape(128, 384, 64)).time_s
    assert est(kind, shape=small).time_s < est(kind, shape=RunShape(128, 128, 256)).time_s
    assert est(kind, shape=small).flops < est(kind, shape=RunShape(256, 128, 64)).flops


def test_backward_is_twice_forward():
    fwd, train = est("inference"), est("train")
    assert train.flops == pytest.approx(3 * fwd.flops)
    assert train.breakdown["compute"] == pytest.approx(3 * fwd.breakdown["compute"])


def test_decoding_is_memory_bound_and_tp_splits_it():
    g = est("generate", shape=RunShape(128, 128, 8))
    assert g.breakdown["decode_mem"] > g.breakdown.get("compute", 0.0)
    g4 = est("generate", Layout(1, 4, 1), shape=RunShape(128, 128, 8))
    assert g4.breakdown["decode_mem"] == pytest.approx(g.breakdown["decode_mem"] / 4, rel=0.05)
    assert g4.breakdown["tp_comm"] > 0 and g.breakdown.get("tp_comm", 0.0) == 0.0


def test_memory_is_sharded_by_tp_pp_and_dp():
    base = est("train")
    tp = est("train", Layout(1, 4, 1))
    pp = est("train", Layout(1, 1, 4), m=4)
    dp = est("train", Layout(4, 1, 1))
    assert tp.weights_bytes == pytest.approx(base.weights_bytes / 4, rel=0.01)
    assert pp.weights_bytes == pytest.approx(base.weights_bytes / 4, rel=0.05)  # embedding / head stages
    assert dp.weights_bytes == base.weights_bytes  # data parallelism replicates weights...
    assert dp.state_bytes == pytest.approx(base.state_bytes / 4)  # ...but ZeRO-1 shards Adam state
    assert base.state_bytes == pytest.approx(12 * model_costs(SEVEN).total_params, rel=0.01)
    assert dp.transient_bytes < base.transient_bytes  # fewer sequences per rank


def test_pipeline_bubble_shrinks_with_micro_batches():
    one = est("inference", Layout(1, 1, 4), m=1)
    many = est("inference", Layout(1, 1, 4), m=16)
    assert many.time_s < one.time_s
    assert one.breakdown["bubble"] > many.breakdown["bubble"]


def test_crossing_nodes_costs_more():
    lay = Layout(8, 1, 1)
    assert est("train", lay, links=Links(dp=True)).time_s > est("train", lay).time_s


def test_70b_does_not_fit_one_gpu_but_fits_a_node_sharded():
    big = get_preset("llama2-70b")
    assert est("train", model=big).mem_bytes > H100.mem_bytes
    assert est("inference", model=big).mem_bytes > H100.mem_bytes
    assert est("inference", Layout(1, 8, 1), model=big, shape=RunShape(128, 128, 8)).mem_bytes < H100.mem_bytes


def test_the_dp_bucket_is_the_runtimes():
    """The estimator prices one collective per bucket of the runtime's size (it cannot import the
    runtime's torch.distributed code, so the number is kept twice and checked here)."""
    from meshrl.parallel.data import BUCKET_BYTES
    from meshrl.plan.estimator import DP_BUCKET_BYTES

    assert DP_BUCKET_BYTES == BUCKET_BYTES


def test_a_decoding_step_pays_the_fitted_bandwidth_share_and_overhead():
    """Weights + KV bytes over (datasheet bandwidth x hbm_eff), plus step_overhead per stage step."""
    shape = RunShape(prompt_len=16, gen_len=2, batch_size=1)  # prefill + exactly one decoding step
    g = est("generate", shape=shape)
    pre = est("generate", shape=RunShape(16, 1, 1))
    step = g.time_s - pre.time_s
    mc = model_costs(SEVEN)
    weights = mc.max_stage_params(1) * 2
    assert step == pytest.approx(weights / (H100.hbm_bw * H100.hbm_eff) + H100.step_overhead, rel=0.02)
    assert 0 < H100.hbm_eff < 1 and H100.step_overhead > 0


def test_training_efficiency_grows_with_the_matmul_width():
    assert H100.flops_at(4096) > H100.flops_at(1024) > 0
    assert H100.flops_at(4096, tp=4) == pytest.approx(H100.flops_at(1024))
    assert H100.flops_at(10**9) == pytest.approx(H100.peak_flops * H100.mfu, rel=1e-3)  # the plateau


def test_response_lengths_drive_the_estimate_as_the_engine_runs_a_batch():
    full = RunShape(128, 512, 64)
    short = RunShape(128, 512, 64, gen_len_mean=128)
    # A batch waits for its longest row: with only a mean known, 64 rows are priced at the budget...
    assert est("generate", shape=short).time_s == pytest.approx(est("generate", shape=full).time_s)
    assert est("train", shape=short).time_s == pytest.approx(est("train", shape=full).time_s)
    # ...one row runs to the mean...
    one, one_short = RunShape(128, 512, 1), RunShape(128, 512, 1, gen_len_mean=128)
    assert est("generate", shape=one_short).time_s < 0.4 * est("generate", shape=one).time_s
    # ...a measured longest row shortens every call...
    measured = RunShape(128, 512, 64, gen_len_mean=128, gen_len_longest=256)
    assert est("generate", shape=measured).time_s < 0.6 * est("generate", shape=full).time_s
    assert est("train", shape=measured).time_s < est("train", shape=full).time_s
    # ...and compacting rows (packing sequences) pays the mean per row and the longest in steps.
    packed = RunShape(128, 512, 64, gen_len_mean=128, gen_len_longest=256, compact=True)
    assert est("generate", shape=packed).time_s < est("generate", shape=measured).time_s
    assert est("train", shape=packed).time_s < est("train", shape=measured).time_s
    # The KV cache is sized for the budget, unless a paged engine holds only the tokens it runs.
    assert est("generate", shape=measured).mem_bytes == est("generate", shape=full).mem_bytes
    assert est("generate", shape=packed).mem_bytes < est("generate", shape=full).mem_bytes


@pytest.mark.parametrize("kind", ["generate", "inference", "train"])
def test_every_call_pays_the_measured_host_time_once(kind):
    """``call_host_s`` (measured by `meshrl profile`: the runtime's time outside its steps, per call)
    is added once to each call, whatever its size or layout; none for the presets, which measured none."""
    from dataclasses import replace

    assert H100.call_host_s == 0.0 and "host" not in est(kind).breakdown
    hw = replace(H100, call_host_s=2e-3)
    for layout in (Layout(), Layout(2, 2, 1)):
        base = est(kind, layout)
        got = estimate_call(CallSpec("c", "actor", kind, SEVEN), SHAPE, layout, 1, hw, Links())
        assert got.time_s == pytest.approx(base.time_s + 2e-3) and got.breakdown["host"] == 2e-3


def test_host_time_is_what_the_runtime_spends_outside_its_steps():
    from meshrl.profile.host import host_gap

    recs = [{"time/iteration": 9.0, "time/call/a": 1.0},  # the warm-up iteration is left out
            {"time/iteration": 1.0, "time/call/a": 0.3, "time/call/b": 0.4, "time/realloc/b": 0.1},
            {"time/iteration": 1.2, "time/call/a": 0.3, "time/call/b": 0.4, "time/transfer/a>b": 0.1},
            {"time/iteration": 1.1, "time/call/a": 0.3, "time/call/b": 0.4}]
    got = host_gap(recs)
    assert got["calls"] == 2 and got["iterations"] == 3
    assert got["call_host_s"] == pytest.approx(0.4 / 2)  # gaps 0.2, 0.4, 0.4: the median over 2 calls


def test_pipelined_decoding_keeps_its_stages_busy():
    """With pp micro-batches in flight (parallel/generate_micro.py) the stages decode at once: a
    KV-bound generation on pp2 reads, per round, each device's half of the weights once per
    micro-batch and its half of the KV cache once, as dp2 does per token (not pp x a stage step
    of the whole batch, stages in turn); the step overheads of the extra micro-batch and the
    prefill's bubble keep it a little behind dp2. More micro-batches than pp only add weight reads."""
    shape = RunShape(prompt_len=128, gen_len=384, batch_size=256)
    one, dp = est("generate", shape=shape), est("generate", Layout(2, 1, 1), shape=shape)
    pp, pp4 = est("generate", Layout(1, 1, 2), m=2, shape=shape), est("generate", Layout(1, 1, 2), m=4, shape=shape)
    assert pp.active > 0.9
    assert dp.time_s < pp.time_s < 1.2 * dp.time_s and pp.time_s < 0.75 * one.time_s
    assert pp.weights_bytes < 0.6 * dp.weights_bytes  # what pp buys over dp: half the weights a device
    assert pp4.time_s > pp.time_s
    turns = est("generate", Layout(1, 1, 2), m=1, shape=shape)  # the stages take turns
    assert turns.time_s > 1.3 * pp.time_s and turns.active < 0.51


def test_a_prompts_samples_are_prefilled_once():
    """GRPO's n samples of a prompt: the prefill computes each distinct prompt once
    (model/generation.PromptBatch), the decode every row; with micro-batches in flight, every row."""
    from meshrl.plan.estimate_generate import prefill_rows

    spec = CallSpec("c", "actor", "generate", SEVEN)
    grouped, single = RunShape(512, 16, 8, samples_per_prompt=4), RunShape(512, 16, 32)
    assert prefill_rows(spec, grouped, 32, 1) == 8 and prefill_rows(spec, single, 32, 1) == 32
    assert prefill_rows(spec, grouped, 16, 2) == 16
    assert prefill_rows(spec, grouped, 3, 1) == 1
    assert est("generate", shape=grouped).time_s < est("generate", shape=single).time_s
    pp = Layout(pp=2)
    in_flight = est("generate", pp, m=2, shape=grouped).time_s
    assert in_flight == pytest.approx(est("generate", pp, m=2, shape=single).time_s)
