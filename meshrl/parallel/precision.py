"""``train.dtype``: the parameter / activation / gradient dtype of a run (see ZeroAdamW for the fp32
master weights). ``auto`` is bfloat16 where the ranks compute on CUDA or on a CPU with bf16 dot
products (AVX512-BF16, AMX: meshrl/cpu_features.py), where a bf16 matmul runs at up to twice the
float32 rate; float32 on other CPUs, which would convert every bf16 operand to float32 first.
``float64`` (CPU only) runs the whole pipeline in float64 — weights, activations, log-probs,
advantages, losses, AdamW's state and every collective — for the exact equality checks between
plans (meshrl/model/numerics.py)."""

from __future__ import annotations

import torch

from ..cpu_features import auto_dtype

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def torch_dtype(name: str, cuda: bool | None = None, bf16_cpu: bool | None = None) -> torch.dtype:
    """``train.dtype`` -> a torch dtype. ``auto``: bfloat16 with ``cuda`` (default: whether CUDA is
    available) or on a CPU with ``bf16_cpu`` (default: ``bf16_by_default()``: bf16 dot products, or
    ``$MESHRL_CPU_BF16``), else float32."""
    if name == "auto":
        name = auto_dtype(torch.cuda.is_available() if cuda is None else cuda, bf16_cpu)
    return DTYPES[name]


AUTO_RULE = "auto: bfloat16 on CUDA and on CPUs with bf16 dot products (AVX512-BF16, AMX), else float32"
