"""``train.compile`` / ``gen.compile`` = auto in a run (meshrl/plan/compile_choice.py through
runtime/job.prepare): resolved with the plan when the run starts from this machine's profile,
printed, written to OUT/config.yaml and kept on --resume (compiled kernels round differently)."""

from __future__ import annotations

import json

import yaml

from meshrl.config import dump_yaml, load_config
from meshrl.model.presets import get_preset
from meshrl.plan.model_costs import model_costs
from meshrl.runtime.job import prepare

# a CPU profile's figures (made up, as tests/plan/test_runtime_settings.py's): every layer fit 1 ms + 10 us a unit
FIT = {"latency_s": 1e-3, "sec_per_unit": 1e-5}
CPU = {"matmul": {"128": 4e10}, "mem_bw": 5e9, "mem_bytes": 8e9, "dtype_bytes": 4,
       "collectives": {"all_reduce": {"2": {"latency_s": 1e-4, "sec_per_byte": 1e-9}},
                       "p2p": {"2": {"latency_s": 5e-5, "sec_per_byte": 2e-9}}}}
ARGS = ["algo=grpo", "data.batch_size=4", "data.gen_len=16"]


def write_profile(path, compiled: dict | None) -> None:
    """A CPU profile file (the test figures of tests/plan/test_runtime_settings.py) for the demo's preset."""
    mc = model_costs(get_preset("tiny"))
    layers = {"128": {"layer_params": mc.layer_params, "head_params": mc.head_params,
                      **{k: FIT for k in ("fwd", "fwd_bwd", "decode", "fixed_fwd", "fixed_fwd_bwd", "fixed_decode")}}}
    path.write_text(json.dumps({**CPU, "layers": layers, **({"compile": compiled} if compiled else {})}))


def compile_of(out) -> tuple:
    saved = yaml.safe_load((out / "config.yaml").read_text())
    return saved["train"]["compile"], saved["gen"]["compile"]


def test_without_a_profile_auto_stays_eager_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MESHRL_PROFILE", str(tmp_path / "none.json"))
    cfg = load_config(None, ARGS)
    _, _, ran = prepare(cfg, "colocated", 1, tmp_path / "run", resume=False, quiet=False)
    assert (ran.train.compile, ran.gen.compile) == (False, False)
    assert compile_of(tmp_path / "run") == (False, False)
    assert "compile: training off, generation off (auto: no profile of this CPU" in capsys.readouterr().out


def test_a_measured_saving_turns_it_on_for_a_long_run_only(tmp_path, monkeypatch, capsys):
    profile = tmp_path / "profile.json"
    # decoding compiled at half the time, training no faster; 20 s to compile the decoding step
    write_profile(profile, {"fwd": 1.0, "fwd_bwd": 1.0, "decode": 0.5, "compile_s": {"decode": 20.0, "fwd": 9.0}})
    monkeypatch.setenv("MESHRL_PROFILE", str(profile))
    short = load_config(None, [*ARGS, "cluster.device=cpu", "train.iterations=2"])
    _, _, ran = prepare(short, "colocated", 1, tmp_path / "short", resume=False, quiet=False)
    assert (ran.train.compile, ran.gen.compile) == (False, False)
    line = capsys.readouterr().out
    assert "generation saves" in line and "for 20 s of compiling: not worth it" in line, line
    long = load_config(None, [*ARGS, "cluster.device=cpu", "train.iterations=100000"])
    _, _, ran = prepare(long, "colocated", 1, tmp_path / "long", resume=False, quiet=True)
    assert (ran.train.compile, ran.gen.compile) == (False, True)  # training saves nothing for its 9 s
    assert compile_of(tmp_path / "long") == (False, True)


def test_resume_keeps_the_choice_the_run_made(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHRL_PROFILE", str(tmp_path / "none.json"))  # today's choice would be eager
    cfg = load_config(None, ARGS)
    (tmp_path / "config.yaml").write_text(dump_yaml(load_config(None, [*ARGS, "gen.compile=true",
                                                                       "train.compile=false"])))
    _, _, resumed = prepare(cfg, "colocated", 1, tmp_path, resume=True, quiet=True)
    assert (resumed.train.compile, resumed.gen.compile) == (False, True)
    explicit = load_config(None, [*ARGS, "gen.compile=false"])  # a setting given on resume is the user's
    _, _, resumed = prepare(explicit, "colocated", 1, tmp_path, resume=True, quiet=True)
    assert resumed.gen.compile is False
