"""``Hardware``: what one device and its links can do, as the estimator needs it (pure Python).

GPU presets carry vendor datasheet numbers, each with its source, and one cited achievable
fraction of peak FLOP/s (MFU). ``cpu`` is not a preset: it is read from the profile file that
``meshrl profile`` measures on this machine, so every CPU number is a measurement.

Collectives follow the ring model that NCCL's own tuner uses (src/graph/tuning.cc):
``time = base latency + steps * per-hop latency + bytes moved per rank / link bandwidth``.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..cores import rank_threads, usable_cores
from ..errors import UserError

GB = 1e9
GIB = 2**30
PROFILE_ENV = "MESHRL_PROFILE"
DEFAULT_PROFILE = Path("~/.cache/meshrl/profile-cpu.json")

# ---- sources (one line each; docs/planner.md expands them) -----------------------------------
A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB: 312 TFLOPS BF16 dense, 2,039 GB/s, 600 GB/s NVLink)"
H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (SXM: 989 TFLOPS BF16 dense, 3.35 TB/s, 80 GB, 900 GB/s NVLink)"
H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (SXM: 989 TFLOPS BF16 dense, 4.8 TB/s, 141 GB, 900 GB/s NVLink)"
DGX_A100 = "NVIDIA DGX A100 system datasheet: 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand (one per GPU)"
DGX_H100 = "NVIDIA DGX H100/H200 system datasheet: 8x single-port ConnectX-7 400 Gb/s NDR InfiniBand (one per GPU)"
NCCL_LAT = ("NCCL src/graph/tuning.cc, Ring/Simple protocol: base latency 8.4 us, per-hop 3.4 us over "
            "NVLink, 14 us over the network")
MFU_A100 = ("fitted (GPU_FIT); cross-check: Narayanan et al., SC'21 (Megatron-LM), 163 of 312 TFLOP/s per A100 "
            "= 52% (GPT 1T, tp 8, counting recomputation)")
MFU_H100 = ("fitted (GPU_FIT); cross-check: Llama 3 Herd of Models (Dubey et al., 2024), Table 4: 38-43% BF16 MFU "
            "on H100 for 405B at tp 8 (w = 2048: 0.55 x 2048 / 2648 = 43%)")

@dataclass(frozen=True)
class GpuFit:
    """Efficiency constants of one GPU kind, fitted on published measurements (bench/published/,
    `python bench/published.py --fit` reproduces them): ``mfu`` and ``mfu_width`` on the MosaicML
    llm-foundry BF16 training table, ``hbm_eff`` and ``step_overhead`` on lmdeploy's A100 static
    decoding benchmark and TensorRT-LLM's A100 first-token latencies."""

    mfu: float
    mfu_width: float
    hbm_eff: float
    step_overhead: float
    source: str


FIT_SOURCE = ("fitted by `python bench/published.py --fit` on bench/published/rows.json: training rows "
              "(MosaicML llm-foundry scripts/train/benchmarking/README.md, BF16, no activation checkpointing), "
              "decoding and prefill rows (lmdeploy docs/en/benchmark/a100_fp16.md; TensorRT-LLM "
              "docs/source/performance.md)")
# H100 and H200 share the compute die: the H100 fit serves both (no H200 rows were found). No H100
# BF16 decoding table was found either, so the H100 decoding constants are the A100's (one H100
# batch-1 row, torchao's Llama-3.1-8B, checks them out of sample: -4%).
GPU_FIT: dict[str, GpuFit] = {
    "a100": GpuFit(mfu=0.73, mfu_width=600.0, hbm_eff=0.75, step_overhead=1.2e-3, source=FIT_SOURCE),
    "h100": GpuFit(mfu=0.55, mfu_width=600.0, hbm_eff=0.75, step_overhead=1.2e-3, source=FIT_SOURCE),
}

NCCL_BASE_LAT = 8.4e-6
NVLINK_HOP_LAT = 3.4e-6
NET_HOP_LAT = 14e-6


@dataclass(frozen=True)
class LinkFit:
    """A measured collective: ``seconds = latency + bytes_per_rank * sec_per_byte`` for one group size."""

    latency: float
    sec_per_byte: float


@dataclass(frozen=True)
class LayerFits:
    """Measured times of one decoder layer of ``layer_params`` parameters (profiles only):
    forward and forward + backward per token, one decoding step per sequence."""

    layer_params: int
    head_params: int
    fwd: LinkFit
    fwd_bwd: LinkFit
    decode: LinkFit
    fixed_fwd: LinkFit  # embedding, head, log-probs, masks: per token
    fixed_fwd_bwd: LinkFit
    fixed_decode: LinkFit  # per sequence: the head, log-softmax and sampling of one step


@dataclass(frozen=True)
class Hardware:
    """One device kind plus its links. Bandwidths in bytes/s (one direction), latencies in s.

    ``matmul`` maps a hidden size to the measured matmul FLOP/s at that size (profiles only);
    ``measured`` maps a collective ('all_reduce', 'all_gather', 'p2p') to fits by group size."""

    name: str
    peak_flops: float
    mfu: float
    hbm_bw: float
    mem_bytes: float
    intra_bw: float
    intra_lat: float
    inter_bw: float
    inter_lat: float
    devices_per_node: int
    base_lat: float = NCCL_BASE_LAT
    dtype_bytes: int = 2  # bytes per weight / activation element: bf16 on GPUs, fp32 on CPU
    sources: dict[str, str] = field(default_factory=dict)
    matmul: tuple[tuple[int, float], ...] = ()
    measured: dict[str, dict[int, LinkFit]] = field(default_factory=dict)
    layers: tuple[tuple[int, LayerFits], ...] = ()  # (hidden size, fits), sorted
    cores: int = 0  # usable cores per node (profiles only; 0: every device is its own, as a GPU)
    contention: tuple[tuple[int, float], ...] = ()  # (busy ranks on a node, slowdown), measured
    # Seconds per decoding step per pipeline stage boundary beyond compute and bytes (process
    # wake-up, the next stage's per-call work, the token broadcast): measured (profile_pipeline.py);
    # 0 for the GPU presets, which price the hop as p2p messages.
    pipeline_hop: float = 0.0
    # Seconds per parameter tensor of an optimizer step beyond its bytes (the runtime's AdamW's
    # per-tensor kernels and Python): measured (profile_layers.measure_optimizer); 0 for GPU presets.
    optimizer_tensor_s: float = 0.0
    # GPU presets, fitted on the published measurements of bench/published/ (see GPU_FIT):
    # the share of the datasheet HBM bandwidth a decoding step reaches, the fixed seconds every
    # stage step pays (kernel launches, host work, sampling), and the matmul width at which
    # training efficiency is half its plateau (efficiency = mfu x w / (w + mfu_width), w = hidden / tp).
    hbm_eff: float = 1.0
    step_overhead: float = 0.0
    mfu_width: float = 0.0
    # Seconds of host time per call outside every priced step (dispatch, batch split and join, host
    # reward rules, statistics): measured by running the one-rank runtime (runtime/profile_host.py);
    # 0 for the GPU presets until `meshrl profile --gpu` measures the host they run on.
    call_host_s: float = 0.0
    # torch threads per rank the CPU figures stand for (plan/thread_scaling.py scaled them to it)
    threads: int = 1

    def slowdown(self, busy: float) -> float:
        """How much slower a step runs while ``busy`` ranks of its node compute (1.0 for GPUs);
        fractional where a call's ranks take turns (pipelined generation: Estimate.active).

        Between measured points the curve is interpolated linearly; beyond the largest measured k it
        follows processor sharing (k runnable processes on c cores get c / k of a core each)."""
        if not self.contention or busy <= 1:
            return 1.0
        ks = [k for k, _ in self.contention]
        i = bisect.bisect_left(ks, busy)
        if i < len(ks) and ks[i] == busy:
            return self.contention[i][1]
        if i == len(ks):
            k, f = self.contention[-1]
            return f * max(1.0, busy / self.cores) / max(1.0, k / self.cores)
        (k0, f0), (k1, f1) = self.contention[i - 1], self.contention[i]
        return f0 + (f1 - f0) * (busy - k0) / (k1 - k0)

    def layer_fits(self, hidden: int) -> LayerFits | None:
        """The measured layer closest in width to ``hidden`` (None for the GPU presets)."""
        if not self.layers:
            return None
        return min(self.layers, key=lambda hf: abs(hf[0] - hidden))[1]

    # ---- compute and memory ----------------------------------------------------------------
    def flops_at(self, hidden: int, tp: int = 1) -> float:
        """Achievable dense matmul FLOP/s for a model of this hidden size split over ``tp`` ranks.

        GPU presets: ``mfu x w / (w + mfu_width)`` with w = hidden / tp, the per-device matmul width
        (narrow matmuls and their non-matmul neighbours keep a GPU further from its plateau)."""
        if not self.matmul:
            w = hidden / max(tp, 1)
            return self.peak_flops * self.mfu * (w / (w + self.mfu_width) if self.mfu_width else 1.0)
        sizes = [h for h, _ in self.matmul]
        i = bisect.bisect_left(sizes, hidden)
        if i == 0:
            return self.matmul[0][1]
        if i == len(sizes):
            return self.matmul[-1][1]
        (h0, f0), (h1, f1) = self.matmul[i - 1], self.matmul[i]
        return f0 + (f1 - f0) * (hidden - h0) / (h1 - h0)

    # ---- links -------------------------------------------------------------------------------
    def _link(self, inter: bool) -> tuple[float, float]:
        return (self.inter_bw, self.inter_lat) if inter else (self.intra_bw, self.intra_lat)

    def _measured(self, kind: str, n: int, per_rank_bytes: float, steps: int) -> float | None:
        fits = self.measured.get(kind)
        if not fits:
            return None
        sizes = sorted(fits)
        g = max([s for s in sizes if s <= n] or [sizes[0]])
        fit = fits[g]
        # Beyond the largest measured group, the ring adds hops of the same per-hop latency.
        hops_scale = steps / max(1, _steps(kind, g))
        return fit.latency * hops_scale + per_rank_bytes * fit.sec_per_byte

    def all_reduce(self, nbytes: float, n: int, inter: bool = False) -> float:
        """Ring all-reduce of ``nbytes`` per rank over ``n`` ranks: 2(n-1) steps of nbytes/n."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        moved = 2 * (n - 1) / n * nbytes
        m = self._measured("all_reduce", n, moved, 2 * (n - 1))
        if m is not None:
            return m
        bw, lat = self._link(inter)
        return self.base_lat + 2 * (n - 1) * lat + moved / bw

    def all_gather(self, nbytes_out: float, n: int, inter: bool = False) -> float:
        """Ring all-gather producing ``nbytes_out`` per rank (each contributes nbytes_out/n)."""
        if n <= 1 or nbytes_out <= 0:
            return 0.0
        moved = (n - 1) / n * nbytes_out
        m = self._measured("all_gather", n, moved, n - 1)
        if m is not None:
            return m
        bw, lat = self._link(inter)
        return self.base_lat + (n - 1) * lat + moved / bw

    def p2p(self, nbytes: float, inter: bool = False) -> float:
        """One send/recv of ``nbytes`` between two devices."""
        if nbytes <= 0:
            return 0.0
        m = self._measured("p2p", 2, nbytes, 1)
        if m is not None:
            return m
        bw, lat = self._link(inter)
        return self.base_lat + lat + nbytes / bw

    def transfer(self, nbytes: float, inter: bool) -> float:
        """Bandwidth term of ``nbytes`` over one link (the latency is added once per step by callers)."""
        if self.measured.get("p2p"):
            return nbytes * self.measured["p2p"][2].sec_per_byte
        return nbytes / self._link(inter)[0]

    @property
    def step_latency(self) -> float:
        if self.measured.get("p2p"):
            return self.measured["p2p"][2].latency
        return self.base_lat + self.inter_lat


def _steps(kind: str, n: int) -> int:
    return {"all_reduce": 2 * (n - 1), "all_gather": n - 1}.get(kind, 1)


def _gpu(name: str, peak: float, fit: GpuFit, hbm: float, mem: float, nvlink: float, ib: float,
         sources: dict[str, str]) -> Hardware:
    return Hardware(name=name, peak_flops=peak, mfu=fit.mfu, hbm_bw=hbm, mem_bytes=mem, intra_bw=nvlink,
                    intra_lat=NVLINK_HOP_LAT, inter_bw=ib, inter_lat=NET_HOP_LAT, devices_per_node=8,
                    sources={**sources, "latency": NCCL_LAT, "fit": fit.source}, hbm_eff=fit.hbm_eff,
                    step_overhead=fit.step_overhead, mfu_width=fit.mfu_width)


# NVLink figures in the datasheets are bidirectional totals: one direction is half.
PRESETS: dict[str, Hardware] = {
    "a100-80g": _gpu("a100-80g", 312e12, GPU_FIT["a100"], 2039 * GB, 80 * GB, 300 * GB, 200e9 / 8,
                     {"device": A100_DS, "network": DGX_A100, "mfu": MFU_A100}),
    "h100-80g": _gpu("h100-80g", 989e12, GPU_FIT["h100"], 3350 * GB, 80 * GB, 450 * GB, 400e9 / 8,
                     {"device": H100_DS, "network": DGX_H100, "mfu": MFU_H100}),
    "h200": _gpu("h200", 989e12, GPU_FIT["h100"], 4800 * GB, 141 * GB, 450 * GB, 400e9 / 8,
                 {"device": H200_DS, "network": DGX_H100, "mfu": MFU_H100}),
}


def device_names() -> tuple[str, ...]:
    """The device names a cluster may name: the GPU presets and ``cpu`` (measured by ``meshrl profile``)."""
    return (*PRESETS, "cpu")


def profile_path(override: str | None = None) -> Path:
    """The CPU profile file: ``override``, else $MESHRL_PROFILE, else ~/.cache/meshrl/profile-cpu.json."""
    return Path(override or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE).expanduser()


def from_profile(data: dict, devices_per_node: int, source: str = "profile", threads: int = 1) -> Hardware:
    """A Hardware whose every number is a measurement from ``meshrl profile``, for ranks of
    ``threads`` torch threads (the one-thread figures scaled by the measured speedup:
    plan/thread_scaling.py).

    Ranks on one machine share its memory, so each gets RAM / devices_per_node."""
    from .thread_scaling import for_threads

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
                    call_host_s=float(data.get("host_gap", {}).get("call_host_s", 0.0)))
        return for_threads(hw, data.get("thread_scaling"), threads)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"profile {source} is malformed ({e!r}); run `meshrl profile` again") from None


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
    """A GPU preset with the figures ``meshrl profile --gpu`` measured (runtime/profile_gpu.py): the
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
