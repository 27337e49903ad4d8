"""``meshrl profile [--quick] [--out FILE]``: measure this machine for the planner.

Matmul throughput at the widths of the presets, memory bandwidth, gloo all-reduce, all-gather and
send/recv latency and bandwidth by group size, the usable cores, the threads of a rank, and the
slowdown of k ranks computing at once (meshrl/profile/cores.py), into the file that ``cluster.device=cpu`` reads
(default ~/.cache/meshrl/profile-cpu.json, or $MESHRL_PROFILE).
"""

from __future__ import annotations

import argparse
import json
from ..errors import UserError
from ..plan.hardware_profile import from_profile, profile_path
from pathlib import Path
from ..plan.hardware import PRESETS
from ..plan.hardware_profile import gpu_from_profile


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure this machine into the planner's CPU profile",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer shapes, group sizes and repetitions (seconds)")
    p.add_argument("--out", metavar="FILE", help="profile file (default $MESHRL_PROFILE or "
                   "~/.cache/meshrl/profile-cpu.json)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per collective measurement")
    p.add_argument("--gpu", metavar="PRESET", help="measure this machine's CUDA device instead (bf16 matmul "
                   "FLOP/s, HBM bandwidth) as the GPU preset PRESET (e.g. h200), read by `meshrl plan "
                   "cluster.device=PRESET --profile FILE`")


def run(args: argparse.Namespace) -> int:
    from ..profile.machine import profile  # lazy: --help and `meshrl plan` load no torch

    if not args.timeout > 0:
        raise UserError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.out is not None and not args.out.strip():
        raise UserError("--out needs a file name")
    if args.gpu:
        return run_gpu(args)
    path = profile_path(args.out)
    if path.is_dir():
        raise UserError(f"--out {path} is a directory; give the profile file's path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {path.parent}: {e}") from None
    data = profile(quick=args.quick, timeout_s=args.timeout)
    from_profile(data, 1, str(path))  # the planner must be able to read what we write
    path.write_text(json.dumps(data, indent=2))
    mm = ", ".join(f"h={h}: {f / 1e9:.1f}" for h, f in data["matmul"].items())
    print(f"matmul GFLOP/s (1 thread, fp32): {mm}")
    print(f"memory bandwidth: {data['mem_bw'] / 1e9:.1f} GB/s")
    for kind, fits in data["collectives"].items():
        for n, fit in fits.items():
            print(f"{kind} x{n}: latency {fit['latency_s'] * 1e6:.0f} us, {1 / fit['sec_per_byte'] / 1e9:.2f} GB/s")
    curve = ", ".join(f"{k}: {f:.2f}x" for k, f in data["contention"]["slowdown"].items())
    print(f"{data['cores']} usable cores, ranks of {data['threads_per_rank']} thread; "
          f"slowdown with k ranks busy at once: {curve}")
    for h, curve in data["thread_scaling"]["speedup"].items():
        sp = "; ".join(f"{t} threads: " + ", ".join(f"{k} {v:.2f}x" for k, v in kinds.items())
                       for t, kinds in curve.items())
        print(f"speedup over 1 thread per rank, h={h}: {sp}")
    print(f"pipeline hop (per stage boundary of a decoding step): {data['pipeline']['hop_s'] * 1e3:.2f} ms")
    opt = data["optimizer"]
    print(f"optimizer step (tiny model, {opt['tensors']} tensors): {opt['step_s'] * 1e3:.1f} ms, "
          f"{opt['sec_per_tensor'] * 1e6:.0f} us per tensor beyond its bytes")
    print(f"host time per call (the runtime outside its steps): {data['host_gap']['call_host_s'] * 1e3:.2f} ms")
    if c := data.get("compile"):
        print(f"torch.compile / eager per layer (h={c['hidden']}): forward {c['fwd']:.2f}x, forward + backward "
              f"{c['fwd_bwd']:.2f}x, decoding step {c['decode']:.2f}x; one-off compile "
              f"{sum(c['compile_s'].values()):.0f} s")
    print(f"wrote {path}")
    return 0


def run_gpu(args: argparse.Namespace) -> int:
    """``--gpu PRESET``: the CUDA branch (meshrl/profile/gpu.py)."""

    import torch  # lazy: --help and `meshrl plan` load no torch

    if args.gpu not in PRESETS:
        raise UserError(f"--gpu {args.gpu!r}: not a GPU preset; known: {', '.join(PRESETS)}")
    if not torch.cuda.is_available():
        raise UserError("--gpu: no CUDA device is visible (a CPU-only build of torch, or no GPU)")
    from ..profile.gpu import profile_gpu  # lazy: --help and `meshrl plan` load no torch

    data = profile_gpu(args.gpu, quick=args.quick)
    hw = gpu_from_profile(PRESETS[args.gpu], data)  # the planner must be able to read what we write
    path = Path(args.out or f"~/.cache/meshrl/profile-{args.gpu}.json").expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    mm = ", ".join(f"h={h}: {f / 1e12:.0f}" for h, f in data["matmul_bf16"].items())
    print(f"{data['gpu']}: bf16 matmul TFLOP/s {mm}; HBM {data['hbm_bw'] / 1e9:.0f} GB/s "
          f"(datasheet {PRESETS[args.gpu].hbm_bw / 1e9:.0f}); planner peak {hw.peak_flops / 1e12:.0f} TFLOP/s; "
          f"host time per call {hw.call_host_s * 1e3:.2f} ms")
    print(f"wrote {path} (meshrl plan cluster.device={args.gpu} --profile {path})")
    return 0
