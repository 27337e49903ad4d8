"""The README's demo block is what `meshrl train` prints on the demo today (bench/readme.py made it).

A change that moves the demo's numerics must regenerate the block in the same commit:
`python bench/readme.py`. The figures depend on the order in which the CPU kernels sum, which
follows torch's CPU capability and the CPU's vendor and matrix units (the block's marker names the
machine kind: bench/readme.py machine_kind); elsewhere the test is skipped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_tool():
    spec = importlib.util.spec_from_file_location("bench_readme", ROOT / "bench" / "readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_demo_block_equals_a_fresh_run():
    tool = _readme_tool()
    kind, block = tool.block_of((ROOT / "README.md").read_text())
    here = tool.machine_kind()
    if kind != here:
        pytest.skip(f"the block was made on a CPU of kind {kind!r}, this one is {here!r}")
    fresh = tool.abridge(tool.demo_output())
    assert tool.comparable(block) == tool.comparable(fresh)
    assert fresh[-1].startswith("held-out accuracy") and "after PPO" in fresh[-1]


def test_abridge_keeps_every_tenth_iteration_and_the_last():
    tool = _readme_tool()
    lines = ["head"] + [f"it {t:3d} | reward/mean 0.1" for t in range(23)] + ["tail"]
    assert tool.abridge(lines) == ["head", "it   0 | reward/mean 0.1", "it  10 | reward/mean 0.1",
                                   "it  20 | reward/mean 0.1", "it  22 | reward/mean 0.1", "tail"]
