"""The planner prices what runs (issue 29): every setting that the runtime reads from cfg.train or
cfg.gen (found by reading meshrl/runtime, meshrl/parallel and meshrl/gen) is either priced by the
planner or named as not changing an iteration's time or memory, with the reason
(meshrl/plan/call_spec.py PRICED / UNPRICED); and each setting the estimator prices moves its
estimate of a fixed plan."""

from __future__ import annotations

import re
from dataclasses import replace
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


# ---- train.compile / gen.compile: the profile's compiled / eager factors, hand-computed ----------

FIT = {"latency_s": 1e-3, "sec_per_unit": 1e-5}
CPU = {"matmul": {"128": 4e10}, "mem_bw": 5e9, "mem_bytes": 8e9, "dtype_bytes": 4,
       "collectives": {"all_reduce": {"2": {"latency_s": 1e-4, "sec_per_byte": 1e-9}},
                       "p2p": {"2": {"latency_s": 5e-5, "sec_per_byte": 2e-9}}}}


def cpu_hardware(compiled: dict | None):
    """A CPU profile whose every layer fit is FIT (latency 1 ms + 10 us a token or a row), with the
    compile factors ``compiled`` (None: a profile that did not measure them)."""
    from meshrl.model.presets import get_preset
    from meshrl.plan.hardware_profile import from_profile
    from meshrl.plan.model_costs import model_costs

    mc = model_costs(get_preset("tiny"))
    layers = {"128": {"layer_params": mc.layer_params, "head_params": mc.head_params,
                      **{k: FIT for k in ("fwd", "fwd_bwd", "decode", "fixed_fwd", "fixed_fwd_bwd", "fixed_decode")}}}
    return from_profile({**CPU, "layers": layers, **({"compile": compiled} if compiled else {})}, 1)


def fit(units: float) -> float:
    return FIT["latency_s"] + FIT["sec_per_unit"] * units


@pytest.mark.parametrize("factors", [{"fwd": 0.8, "fwd_bwd": 0.7, "decode": 0.5},  # compiling helps
                                     {"fwd": 1.25, "fwd_bwd": 1.5, "decode": 1.1}])  # compiling costs
def test_compile_prices_the_layers_at_the_measured_factors(factors):
    from meshrl.layout.mesh import Layout
    from meshrl.model.presets import get_preset
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call

    tiny, hw = get_preset("tiny"), cpu_hardware({**factors, "compile_s": {"fwd": 5.0}})
    layers, tokens = tiny.num_hidden_layers, 8 * 32
    eager = RunShape(prompt_len=16, gen_len=16, batch_size=8)
    train_c, gen_c = replace(eager, compile_layers=True), replace(eager, compile_gen=True)
    ref, gen = CallSpec("r", "ref", "inference", tiny), CallSpec("g", "actor", "generate", tiny)
    actor = CallSpec("t", "actor", "train", tiny)

    inf = estimate_call(ref, train_c, Layout(), 1, hw).time_s
    assert inf == pytest.approx(layers * fit(tokens) * factors["fwd"] + fit(tokens))
    prefill = layers * fit(8 * 16) * factors["fwd"] + fit(8)  # the prefill runs the compiled layer function
    step = layers * fit(8) * factors["decode"] + fit(8)
    assert estimate_call(gen, gen_c, Layout(), 1, hw).time_s == pytest.approx(prefill + 15 * step)
    t0, t1 = (estimate_call(actor, s, Layout(), 1, hw).time_s for s in (eager, train_c))
    assert t1 - t0 == pytest.approx(layers * fit(tokens) * (factors["fwd_bwd"] - 1))
    # each key prices its own calls only; tensor parallelism and the GPU presets stay eager
    assert estimate_call(ref, gen_c, Layout(), 1, hw).time_s == estimate_call(ref, eager, Layout(), 1, hw).time_s
    assert estimate_call(gen, train_c, Layout(), 1, hw).time_s == estimate_call(gen, eager, Layout(), 1, hw).time_s
    tp2 = Layout(1, 2, 1)
    assert estimate_call(ref, train_c, tp2, 1, hw).time_s == estimate_call(ref, eager, tp2, 1, hw).time_s
    assert hw.compiled.compile_s == (("fwd", 5.0),)


def test_compile_without_a_measurement_is_priced_eager_and_says_why():
    from meshrl.plan.hardware import PRESETS

    assert cpu_hardware(None).compiled.of("fwd_bwd") == 1.0
    for hw in PRESETS.values():
        assert hw.compiled.of("decode") == 1.0 and "ASPLOS 2024" in hw.sources["compile"]
    t0, m0 = priced([])
    assert priced(["train.compile=true", "gen.compile=true"]) == (t0, m0)  # a100-80g: eager, by that reason


def test_the_shape_reads_both_compile_keys():
    from meshrl.plan.call_spec import RunShape

    shape = RunShape.from_config(load_config(None, ["train.compile=true", "gen.compile=true"]))
    assert shape.compile_layers and shape.compile_gen
    vllm = RunShape.from_config(load_config(None, ["gen.compile=true", "gen.backend=vllm"]))
    assert not vllm.compile_gen and not RunShape.from_config(load_config(None, [])).compile_layers


def test_a_profile_with_bad_compile_factors_is_refused():
    from meshrl.errors import UserError

    with pytest.raises(UserError, match="malformed"):
        cpu_hardware({"fwd": 0.0, "fwd_bwd": 1.0, "decode": 1.0})


def test_meshrl_plan_says_how_it_priced_compile(capsys):
    from meshrl.cli import main

    assert main(["plan", *BASE, "train.compile=true", "--strategy", "colocated"]) == 0
    out = capsys.readouterr().out
    assert "train.compile: priced as eager (no measurement of meshrl's compiled layers on this GPU" in out


@pytest.mark.timeout(900)  # three real compiles (forward, forward + backward, a decoding step)
def test_the_profile_measures_compiled_against_eager():
    """meshrl/profile/compile.py on the tiny preset at small sizes: positive factors and the compile
    times the planner reads (tests/model/test_compiled_layers.py checks that the numbers are eager's)."""
    import torch

    from meshrl.plan.hardware_profile import _compiled
    from meshrl.profile.compile import measure_compile

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = measure_compile(1, batch=2, seq=16, decode_batch=2)
    finally:
        torch.set_num_threads(prev)
    assert res["hidden"] == 128 and all(res[k] > 0 for k in ("fwd", "fwd_bwd", "decode"))
    assert set(res["compile_s"]) == {"fwd", "fwd_bwd", "decode"} and all(v > 0 for v in res["compile_s"].values())
    speed = _compiled(res)
    assert (speed.fwd, speed.fwd_bwd, speed.decode) == (res["fwd"], res["fwd_bwd"], res["decode"])


def test_an_moe_prefill_stays_eager_under_gen_compile():
    """The runtime compiles an MoE model's decoding step but not its prefill (model/compiled_layers.py
    prefill_layer): the estimator prices exactly that."""
    from meshrl.layout.mesh import Layout
    from meshrl.model.presets import get_preset
    from meshrl.plan.estimate_steps import Ctx
    from meshrl.plan.estimator import NO_LINKS
    from meshrl.plan.model_costs import model_costs

    hw = cpu_hardware({"fwd": 0.8, "fwd_bwd": 0.7, "decode": 0.5})
    moe, dense = (model_costs(get_preset(p)) for p in ("qwen3-30b-a3b", "tiny"))
    assert moe.cfg.num_experts and not dense.cfg.num_experts
    on = {m: Ctx(m, hw, Layout(), NO_LINKS, gen_compiled=True) for m in (moe, dense)}
    assert (on[moe].speed("prefill"), on[moe].speed("decode")) == (1.0, 0.5)
    assert (on[dense].speed("prefill"), on[dense].speed("decode")) == (0.8, 0.5)


def test_streaming_prices_the_re_prefill_of_each_version():
    """train.stream_steps (auto: ceil(gen_len / k) at k >= 2): a batch's generation is k segments,
    each re-prefilling prompt + tokens so far, as runtime/stream.py runs them: the same decode steps
    as a whole batch, each later version's first token coming from a prefill of the longer context."""
    from dataclasses import replace

    from meshrl.plan.call_spec import RunShape
    from meshrl.plan.estimator import CallSpec, estimate_call

    shape = RunShape(prompt_len=16, gen_len=16, batch_size=8, stream_steps=6, stream_lag=3)
    assert [(w, s.prompt_len, s.gen_len) for w, s in shape.turn_shapes()] == [(1.0, 16, 6), (1.0, 22, 6),
                                                                               (1.0, 28, 4)]
    assert [s.gen_len for _, s in replace(shape, stream_steps=8).turn_shapes()] == [8, 8]  # nothing left at the bound
    t_k2 = {}
    for extra in ([], ["train.stream_steps=0"]):
        problem = problem_from_config(load_config(None, BASE + ["train.off_policy=2", *extra]))
        calls = {n: CallPlan(Mesh.range(0, 8), Layout(8, 1, 1)) for n in problem.graph.names}
        t_k2[bool(extra)] = problem.call_estimate("actor_gen", calls["actor_gen"]).time_s
        assert problem.shape.stream_steps == (0 if extra else 8) and problem.shape.stream_lag == 2
    gen = CallSpec("g", "actor", "generate", problem.models["actor"])
    lay, hw = Layout(8, 1, 1), problem.hw
    whole = estimate_call(gen, replace(problem.shape, stream_steps=0), lay, 1, hw).time_s
    halves = [estimate_call(gen, replace(problem.shape, prompt_len=p, gen_len=8, stream_steps=0), lay, 1, hw).time_s
              for p in (16, 24)]
    assert t_k2[True] == pytest.approx(whole, rel=1e-12) and t_k2[False] == pytest.approx(sum(halves), rel=1e-12)
    assert t_k2[False] != pytest.approx(whole, rel=1e-9)
