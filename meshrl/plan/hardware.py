"""``Hardware``: what one device and its links can do, as the estimator needs it (pure Python).

GPU presets carry vendor datasheet numbers, each with its source, and one cited achievable
fraction of peak FLOP/s (MFU). ``cpu`` is not a preset: it is read from the profile file that
``meshrl profile`` measures on this machine, so every CPU number is a measurement.

Collectives follow the ring model that NCCL's own tuner uses (src/graph/tuning.cc):
``time = base latency + steps * per-hop latency + bytes moved per rank / link bandwidth``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path


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

# torch.compile on the GPU presets: priced as eager. The one published figure across models, the
# PyTorch 2 paper's (Ansel et al., ASPLOS 2024: TorchInductor 1.41x training and 2.27x inference,
# geometric means over 180+ models on an A100), is a mean over mostly small vision and language
# models at their own sizes, not a figure for the billion-parameter decoder layers planned here,
# whose time is matmuls and attention that compiling leaves as library calls; and the decoding
# constants above are fitted on lmdeploy and TensorRT-LLM, engines that already fuse kernels and
# replay CUDA graphs (the one torch.compile row of bench/published/, torchao's Llama-3.1-8B decoding
# on an H100, is predicted 4% fast as it is). A CPU profile measures the factors (profile/compile.py).
COMPILE_GPU = ("no measurement of meshrl's compiled layers on this GPU; "
               "PyTorch 2 (ASPLOS 2024) reports 1.41x training / 2.27x inference geomeans over 180+ mostly "
               "small models on an A100, not decoder layers of this size (plan/hardware.py COMPILE_GPU)")


@dataclass(frozen=True)
class CompileSpeed:
    """torch.compile's seconds over eager's for one decoder layer (1.0: priced as eager), as the
    runtime compiles (meshrl/model/compiled_layers.py; tp = 1, dense layers): ``fwd`` a forward
    without gradients (inference under train.compile, the prefill under gen.compile), ``fwd_bwd``
    forward + backward (training, train.compile), ``decode`` one decoding step (gen.compile).
    ``compile_s``: the one-off compile of each kind, in seconds (reported, never in an iteration's
    price)."""

    fwd: float = 1.0
    fwd_bwd: float = 1.0
    decode: float = 1.0
    compile_s: tuple[tuple[str, float], ...] = ()

    def of(self, kind: str) -> float:
        """fwd, fwd_bwd or decode; a prefill's is fwd's (the same compiled layer function, with its cache)."""
        return self.fwd if kind == "prefill" else getattr(self, kind)


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
    dtype_bytes: int = 2  # bytes per weight / activation element: bf16 on GPUs, the profile's dtype on a CPU
    sources: dict[str, str] = field(default_factory=dict)
    matmul: tuple[tuple[int, float], ...] = ()
    measured: dict[str, dict[int, LinkFit]] = field(default_factory=dict)
    layers: tuple[tuple[int, LayerFits], ...] = ()  # (hidden size, fits), sorted
    cores: int = 0  # usable cores per node (profiles only; 0: every device is its own, as a GPU)
    contention: tuple[tuple[int, float], ...] = ()  # (busy ranks on a node, slowdown), measured
    # Seconds per decoding step per pipeline stage boundary beyond compute and bytes (process
    # wake-up, the next stage's per-call work, the token broadcast): measured (profile/pipeline.py);
    # 0 for the GPU presets, which price the hop as p2p messages.
    pipeline_hop: float = 0.0
    # Seconds per parameter tensor of an optimizer step beyond its bytes (the runtime's AdamW's
    # per-tensor kernels and Python): measured (profile/layers.measure_optimizer); 0 for GPU presets.
    optimizer_tensor_s: float = 0.0
    # GPU presets, fitted on the published measurements of bench/published/ (see GPU_FIT):
    # the share of the datasheet HBM bandwidth a decoding step reaches, the fixed seconds every
    # stage step pays (kernel launches, host work, sampling), and the matmul width at which
    # training efficiency is half its plateau (efficiency = mfu x w / (w + mfu_width), w = hidden / tp).
    hbm_eff: float = 1.0
    step_overhead: float = 0.0
    mfu_width: float = 0.0
    # Seconds of host time per call outside every priced step (dispatch, batch split and join, host
    # reward rules, statistics): measured by running the one-rank runtime (profile/host.py);
    # 0 for the GPU presets until `meshrl profile --gpu` measures the host they run on.
    call_host_s: float = 0.0
    # torch threads per rank the CPU figures stand for (plan/thread_scaling.py scaled them to it)
    threads: int = 1
    # train.compile / gen.compile: measured by a CPU profile; eager for the GPU presets (COMPILE_GPU)
    compiled: CompileSpeed = CompileSpeed()
    # The runtime's CPU code paths run on this device (its memory is priced as they hold it: float32
    # attention for bf16, decoding's fused or packed weight copies): a measured CPU profile, or the
    # GPU preset that stands in for one (plan/fallback.py).
    cpu: bool = False

    @property
    def device(self) -> str:
        """What the ranks run on, for messages: "cpu" for the CPU and its stand-in, else the preset."""
        return "cpu" if self.cpu else self.name

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
                    sources={**sources, "latency": NCCL_LAT, "fit": fit.source, "compile": COMPILE_GPU},
                    hbm_eff=fit.hbm_eff,
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
