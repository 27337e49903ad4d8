"""Hardware from a measured profile (``meshrl profile``): the CPU's every number, or a GPU preset
with its measured figures; ``get_hardware`` gives the Hardware a cluster's device names (the
presets of meshrl/plan/hardware.py, or ``cpu`` from the profile file)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from ..cores import rank_threads, usable_cores
from ..errors import UserError
from .hardware import DEFAULT_PROFILE, PRESETS, PROFILE_ENV, CompileSpeed, Hardware, LayerFits, LinkFit
from .thread_scaling import for_threads


def profile_path(override: str | None = None) -> Path:
    """The CPU profile file: ``override``, else $MESHRL_PROFILE, else ~/.cache/meshrl/profile-cpu.json."""
    return Path(override or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE).expanduser()


def from_profile(data: dict, devices_per_node: int, source: str = "profile", threads: int = 1) -> Hardware:
    """A Hardware whose every number is a measurement from ``meshrl profile``, for ranks of
    ``threads`` torch threads (the one-thread figures scaled by the measured speedup:
    plan/thread_scaling.py).

    Ranks on one machine share its memory, so each gets RAM / devices_per_node."""
    try:
        matmul = tuple(sorted((int(h), float(f)) for h, f in data["matmul"].items()))
        measured = {kind: {int(n): LinkFit(float(v["latency_s"]), float(v["sec_per_byte"]))
                           for n, v in fits.items()}
                    for kind, fits in data.get("collectives", {}).items()}
        layers = tuple(sorted(
            (int(h), LayerFits(int(v["layer_params"]), int(v["head_params"]),
                               *(LinkFit(float(v[k]["latency_s"]), float(v[k]["sec_per_unit"]))
                                 for k in ("fwd", "fwd_bwd", "decode", "fixed_fwd", "fixed_fwd_bwd",
                                           "fixed_decode"))))
            for h, v in data.get("layers", {}).items()))
        contention = _contention(data)
        p2p = measured.get("p2p", {}).get(2)
        bw = 1.0 / p2p.sec_per_byte if p2p else float(data["mem_bw"])
        lat = p2p.latency if p2p else 0.0
        hw = Hardware(name="cpu", peak_flops=max(f for _, f in matmul), mfu=1.0, hbm_bw=float(data["mem_bw"]),
                    mem_bytes=float(data["mem_bytes"]) / devices_per_node, intra_bw=bw, intra_lat=lat,
                    inter_bw=bw, inter_lat=lat, devices_per_node=devices_per_node, base_lat=0.0,
                    dtype_bytes=int(data.get("dtype_bytes", 4)),
                    sources={"all": f"measured by meshrl profile ({source})"}, matmul=matmul,
                    measured=measured, layers=layers, cores=int(data.get("cores", 0)) if contention else 0,
                    contention=contention, pipeline_hop=float(data.get("pipeline", {}).get("hop_s", 0.0)),
                    optimizer_tensor_s=float(data.get("optimizer", {}).get("sec_per_tensor", 0.0)),
                    call_host_s=float(data.get("host_gap", {}).get("call_host_s", 0.0)),
                    compiled=_compiled(data.get("compile")), cpu=True)
        return for_threads(hw, data.get("thread_scaling"), threads)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"profile {source} is malformed ({e!r}); run `meshrl profile` again") from None


def _compiled(c: dict | None) -> CompileSpeed:
    """torch.compile's measured factors (profile/compile.py); a profile without them (quick, or from
    before they were measured) prices compiled layers as eager."""
    if not c:
        return CompileSpeed()
    factors = {k: float(c[k]) for k in ("fwd", "fwd_bwd", "decode")}
    if not all(f > 0 for f in factors.values()):
        raise ValueError(f"compile factors {factors}")
    return CompileSpeed(**factors, compile_s=tuple(sorted((k, float(v)) for k, v in c.get("compile_s", {}).items())))


def _contention(data: dict) -> tuple[tuple[int, float], ...]:
    """The measured slowdown curve, made physical: at least 1 (sharing never speeds a rank up) and
    non-decreasing in k (more busy ranks never make each faster), so noise below either reads as
    the bound. Profiles from before it was measured have none: no slowdown is then modelled."""
    c = data.get("contention")
    if not c:
        return ()
    if int(data["cores"]) < 1:
        raise ValueError(f"cores={data['cores']}")
    out, top = [], 1.0
    for k, f in sorted((int(k), float(f)) for k, f in c["slowdown"].items()):
        top = max(top, f)
        out.append((k, top))
    return tuple(out)


def gpu_from_profile(hw: Hardware, data: dict, source: str = "profile") -> Hardware:
    """A GPU preset with the figures ``meshrl profile --gpu`` measured (profile/gpu.py): the
    largest-width bf16 matmul FLOP/s as the peak with mfu 1 (what a layer's matmul achieves), the
    measured copy bandwidth with hbm_eff 1; everything else stays the preset's."""
    try:
        flops = max(float(f) for f in data["matmul_bf16"].values())
        host = data.get("host_gap")
        return replace(hw, peak_flops=flops, mfu=1.0, mfu_width=0.0, hbm_bw=float(data["hbm_bw"]), hbm_eff=1.0,
                       call_host_s=float(host["call_host_s"]) if host else hw.call_host_s,
                       sources={**hw.sources, "peak_flops": f"measured ({source})", "hbm_bw": f"measured ({source})",
                                **({"call_host_s": f"measured ({source})"} if host else {})})
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"GPU profile {source} is malformed ({e!r}); run `meshrl profile --gpu` again") from None


def load_profile(path: str | Path | None = None, devices_per_node: int = 1, threads: int | None = None
                 ) -> Hardware:
    """The CPU profile as a Hardware for ranks of ``threads`` torch threads (None: what
    ``train.threads=0`` gives each of ``devices_per_node`` ranks here: meshrl/cores.py)."""
    p = profile_path(str(path) if path else None)
    if not p.is_file():
        raise UserError(f"cluster.device=cpu needs a measured profile, and {p} does not exist; "
                        f"run `meshrl profile` first (or set ${PROFILE_ENV} / --profile to a profile file)")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"profile {p} is not valid JSON ({e}); run `meshrl profile` again") from None
    if threads is None:
        threads = rank_threads(0, devices_per_node)[0]
    for line in profile_mismatches(data, threads, usable_cores()):
        print(f"meshrl: warning: profile {p}: {line}", file=sys.stderr)
    return from_profile(data, devices_per_node, str(p), threads)


def profile_mismatches(data: dict, threads: int, cores: int) -> list[str]:
    """Why a profile's times would not hold for ranks of ``threads`` torch threads started here: a
    profile without the thread speedup measured (from before it was), taken with another thread
    count per rank, or on another number of usable cores (the shared-cores curve and the speedups
    were measured on the profile's)."""
    out = []
    scaled = bool((data.get("thread_scaling") or {}).get("speedup"))
    if not scaled and int(data.get("threads_per_rank", 1)) != threads:
        out.append(f"measured with {data.get('threads_per_rank', 1)} thread(s) per rank and no speedup of more "
                   f"threads, but ranks started here get {threads} (train.threads, $OMP_NUM_THREADS or the "
                   "usable cores split between the ranks); run `meshrl profile` again")
    if int(data.get("cores", 0) or 0) not in (0, cores):
        out.append(f"measured on {data['cores']} usable cores, but this process may use {cores}; "
                   "run `meshrl profile` again here")
    return out


def get_hardware(device: str, devices_per_node: int, profile: str | None = None, threads: int | None = None
                 ) -> Hardware:
    """The Hardware for ``cluster.device``; an unknown device names the known ones. ``threads``:
    torch threads per rank on a CPU (None: the default for ``devices_per_node`` ranks)."""
    if device == "cpu":
        return load_profile(profile, devices_per_node, threads)
    if device not in PRESETS:
        raise UserError(f"unknown device {device!r}; known devices: {', '.join(PRESETS)}, cpu (measured)")
    hw = PRESETS[device]
    if profile and Path(profile).is_file():  # a GPU profile (meshrl profile --gpu) of this device
        data = json.loads(Path(profile).read_text())
        if data.get("device") == device and "matmul_bf16" in data:
            hw = gpu_from_profile(hw, data, str(profile))
    if devices_per_node > hw.devices_per_node:
        raise UserError(f"cluster.devices_per_node={devices_per_node}, but a {device} node has at most "
                        f"{hw.devices_per_node} devices")
    return hw
