"""Freed host memory stays in the process (meshrl/host_memory.py): a step's activations reuse pages
instead of faulting in new ones, in this process and in the launcher's ranks; the user's glibc
variables and MESHRL_KEEP_FREED_MEMORY=0 win."""

import os
import subprocess
import sys

import pytest

from meshrl.host_memory import ENV, freed_memory_env
from meshrl.runtime.launch import RankPool

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# 48 MiB tensors (above glibc's largest mmap threshold, 32 MiB) allocated and freed 40 times:
# the minor page faults of the last 10 rounds. With the setting, the first rounds may still fault
# (up to ~8 of them: the heap grows while the interpreter's small allocations land between the
# blocks) before the heap holds room for one block for good; the warm-up rounds cover that.
FAULTS = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from meshrl.host_memory import keep_freed_memory
    keep_freed_memory()
def rounds(n):
    for _ in range(n):
        torch.ones(12 << 20).sum()
rounds(30)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(10)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "MESHRL_KEEP_FREED_MEMORY"}
    env["THP_MEM_ALLOC_ENABLE"] = "0"
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout.split()[-1])


@glibc
def test_kept_memory_does_not_fault_again():
    """Each fresh 48 MiB block faults its 12,288 pages in without it; none do with it."""
    assert _faults("plain") > 10 * 12288 // 2
    assert _faults("keep") < 100


def test_the_users_variables_and_the_opt_out_win():
    assert freed_memory_env({}) == ENV
    assert freed_memory_env({"MALLOC_TRIM_THRESHOLD_": "1000"})["MALLOC_TRIM_THRESHOLD_"] == "1000"
    assert freed_memory_env({"MESHRL_KEEP_FREED_MEMORY": "0"}) == {}


def _malloc_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


@glibc
def test_ranks_start_with_the_variables(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("MESHRL_KEEP_FREED_MEMORY", raising=False)
    with RankPool(2, timeout=60) as pool:
        assert pool.run(_malloc_env) == [ENV] * 2
