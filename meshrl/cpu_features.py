"""What this machine's CPU computes natively, as the defaults that depend on it ask.

Pure Python (no torch): the planner prices a CPU run in the dtype the runtime will pick
(meshrl/plan/problem.py), and ``meshrl plan`` loads no torch.

``native_bf16``: the CPU has bf16 dot-product instructions (AVX512-BF16, or AMX's bf16 tiles), so
oneDNN's bf16 matmuls run at up to twice the float32 rate instead of converting to float32 first.
There ``train.dtype=auto`` is bfloat16 (meshrl/parallel/precision.py), a decode step's bf16
projections are packed for oneDNN (meshrl/model/decode_weights.py), and bf16 attention runs as
bf16 matmuls over short sequences (``short_attention``). The flags are the kernel's
names for the CPUID bits torch's own check reads (``torch.cpu._is_avx512_bf16_supported``).

``$MESHRL_CPU_BF16`` (``1`` / ``0``) overrides what ``train.dtype=auto`` takes on a CPU (not which
kernels run): ``0`` keeps float32 on a CPU with bf16 dot products, as the test suite does
(tests/conftest.py) for its float32 tolerances; ``train.dtype=float32`` pins one run.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from .errors import UserError

CPUINFO = Path("/proc/cpuinfo")
# The longest key length at which bf16 attention over whole sequences (training, reference /
# critic inference, a prefill) runs on such a CPU as two bf16 matmuls and a float32 softmax over the
# materialised scores (model/attention.py short_attention) instead of SDPA's flash kernel on
# float32 copies, whose blocking is built for long sequences: `python bench/short_attention.py`
# measures the crossover (docs/model.md "Short attention"); the estimator prices the scores
# (plan/model_costs.py).
SHORT_ATTENTION_KEYS = 128
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ENV = "MESHRL_CPU_BF16"


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first CPU's ``flags`` in /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@lru_cache(maxsize=None)
def native_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this CPU has bf16 dot products (AVX512-BF16 or AMX-BF16)."""
    return any(f in cpu_flags(cpuinfo) for f in BF16_FLAGS)


def short_keys(keys: int) -> bool:
    """Whether ``keys`` keys are few enough for short_attention (at most SHORT_ATTENTION_KEYS)."""
    return 0 < keys <= SHORT_ATTENTION_KEYS


def short_attention(bf16: bool, keys: int) -> bool:
    """Whether attention over ``keys`` keys runs as short_attention on this CPU: bf16 on a CPU with
    bf16 dot products, at most SHORT_ATTENTION_KEYS keys."""
    return bf16 and short_keys(keys) and native_bf16()


def bf16_by_default(env: dict[str, str] | None = None) -> bool:
    """Whether ``train.dtype=auto`` is bfloat16 on this CPU: ``$MESHRL_CPU_BF16`` where set, else
    ``native_bf16()``."""
    raw = (os.environ if env is None else env).get(ENV, "").strip()
    if raw in ("0", "1"):
        return raw == "1"
    if raw:
        raise UserError(f"${ENV} must be 1 (bf16 by default on this CPU) or 0 (float32), got {raw!r}")
    return native_bf16()


def auto_dtype(gpu: bool, bf16_cpu: bool | None = None) -> str:
    """``train.dtype=auto`` as a dtype name: bfloat16 on a GPU or on a CPU with ``bf16_cpu``
    (default: ``bf16_by_default()``), else float32. The one rule the runtime, the planner and the
    dry run share."""
    return "bfloat16" if gpu or (bf16_by_default() if bf16_cpu is None else bf16_cpu) else "float32"
