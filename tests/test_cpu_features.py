"""cpu_features reads the CPU's bf16 instructions from /proc/cpuinfo's flags, which decide
train.dtype=auto on a CPU (meshrl/parallel/precision.py) and the planner's bytes per element."""

from __future__ import annotations

import pytest

from meshrl.config import load_config
from meshrl.cpu_features import ENV, bf16_by_default, cpu_flags, native_bf16
from meshrl.errors import UserError
from meshrl.parallel.precision import torch_dtype

INFO = "processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu sse2 avx2 {extra}\n\nprocessor\t: 1\nflags\t\t: fpu\n"


@pytest.mark.parametrize("extra, want", [("avx512f avx512_bf16", True), ("amx_tile amx_bf16", True),
                                         ("avx512f avx512_vnni", False), ("", False)])
def test_native_bf16_follows_the_first_cpus_flags(tmp_path, extra, want):
    info = tmp_path / "cpuinfo"
    info.write_text(INFO.format(vendor="AuthenticAMD", extra=extra))
    assert native_bf16(info) is want
    assert ("avx2" in cpu_flags(info)) and ("fpu" in cpu_flags(info))


def test_no_cpuinfo_means_no_native_bf16(tmp_path):
    assert cpu_flags(tmp_path / "absent") == frozenset()
    assert native_bf16(tmp_path / "absent") is False


def test_the_environment_overrides_the_cpu_default_and_refuses_anything_else():
    assert bf16_by_default({ENV: "1"}) is True and bf16_by_default({ENV: "0"}) is False
    assert bf16_by_default({}) is native_bf16()
    with pytest.raises(UserError, match=ENV):
        bf16_by_default({ENV: "yes"})


def test_auto_dtype_is_bf16_on_cuda_and_on_a_bf16_cpu_only(monkeypatch):
    import torch

    assert torch_dtype("auto", cuda=False, bf16_cpu=False) == torch.float32
    assert torch_dtype("auto", cuda=False, bf16_cpu=True) == torch.bfloat16
    assert torch_dtype("auto", cuda=True, bf16_cpu=False) == torch.bfloat16
    assert torch_dtype("float32", cuda=True, bf16_cpu=True) == torch.float32
    here = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert native_bf16() is here  # the flags agree with torch's own CPUID check
    assert torch_dtype("auto", cuda=False) == torch.float32  # the suite's pin (tests/conftest.py)
    monkeypatch.delenv(ENV)
    assert torch_dtype("auto", cuda=False) == (torch.bfloat16 if here else torch.float32)


def test_the_planner_prices_a_cpu_run_in_the_dtype_the_runtime_takes(tmp_path, monkeypatch):
    import json

    from meshrl.plan import problem

    fit = {"latency_s": 1e-3, "sec_per_unit": 1e-5}
    prof = tmp_path / "profile.json"  # a CPU profile's fields (made-up figures), as a float32 profile writes them
    prof.write_text(json.dumps({"matmul": {"128": 4e10}, "mem_bw": 5e9, "mem_bytes": 8e9, "dtype_bytes": 4,
                                "collectives": {"p2p": {"2": {"latency_s": 5e-5, "sec_per_byte": 2e-9}}},
                                "layers": {"128": {"layer_params": 1, "head_params": 1,
                                                   **{k: fit for k in ("fwd", "fwd_bwd", "decode", "fixed_fwd",
                                                                       "fixed_fwd_bwd", "fixed_decode")}}}}))
    for bf16, want in ((True, 2), (False, 4)):
        monkeypatch.setenv(ENV, str(int(bf16)))
        assert problem.problem_from_config(load_config(None, []), str(prof)).hw.dtype_bytes == want
        pinned = load_config(None, ["train.dtype=float32"])
        assert problem.problem_from_config(pinned, str(prof)).hw.dtype_bytes == problem.DTYPE_BYTES["float32"]
    gpu = load_config(None, ["cluster.device=h100-80g"])
    assert problem.problem_from_config(gpu).hw.dtype_bytes == 2


def test_a_bad_setting_stops_meshrl_train_before_it_writes_anything(tmp_path, monkeypatch, capsys):
    from meshrl.cli import main

    monkeypatch.setenv(ENV, "yes")
    out = tmp_path / "run"
    assert main(["train", "train.iterations=1", "--out", str(out), "--no-progress"]) != 0
    assert ENV in capsys.readouterr().err and not out.exists()
