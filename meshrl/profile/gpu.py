"""``meshrl profile --gpu``: measure this machine's CUDA device for the planner.

Two figures, the ones the GPU presets take from datasheets (plan/hardware.py): bf16 matmul FLOP/s
at the presets' widths (a [4096, h] x [h, 4h] product, as a layer's MLP does, median of timed reps
after a warm-up) and HBM bandwidth (a device-to-device copy of 1 GiB: read + write bytes over the
time). ``gpu_from_profile`` (plan/hardware_profile.py) puts them into the device preset: the measured peak
with mfu 1 (the matmul is what a layer achieves), the measured bandwidth with hbm_eff 1; the links,
memory size and the published fits stay the preset's.
"""

from __future__ import annotations

import statistics
import time

import torch

from .host import measure_host_gap

WIDTHS = (896, 1536, 4096, 8192)  # qwen2.5-0.5b/1.5b, llama2-7b, llama2-70b hidden sizes


def _timed(fn, dev: torch.device, reps: int) -> float:
    fn()
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_gpu(device: str, quick: bool = False) -> dict:
    """{"device": preset name, "gpu": CUDA name, "matmul_bf16": {h: FLOP/s}, "hbm_bw": bytes/s,
    "host_gap": {"call_host_s": seconds, ...}} (profile/host.py)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    reps = 3 if quick else 10
    matmul = {}
    for h in WIDTHS[:2] if quick else WIDTHS:
        a = torch.randn(4096, h, device=dev, dtype=torch.bfloat16)
        b = torch.randn(h, 4 * h, device=dev, dtype=torch.bfloat16)
        sec = _timed(lambda a=a, b=b: a @ b, dev, reps)
        matmul[str(h)] = 2 * 4096 * h * 4 * h / sec
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    sec = _timed(lambda: dst.copy_(src), dev, reps)
    return {"device": device, "gpu": torch.cuda.get_device_name(dev), "matmul_bf16": matmul,
            "hbm_bw": 2 * src.numel() / sec, "torch": torch.__version__,
            "host_gap": measure_host_gap(quick)}  # the runtime on this GPU and its host: time per call
