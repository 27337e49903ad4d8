"""``meshrl profile``'s measuring side: this machine's matmul throughput, memory bandwidth, gloo
collective latency and bandwidth by group size, and how its cores are shared between ranks
(meshrl/profile/cores.py), written as the JSON the planner reads (meshrl/plan/hardware.py:
``from_profile``).

Compute is measured with one thread, in the dtype a run on this CPU takes at ``train.dtype=auto``
(bf16 with bf16 dot products, else fp32: meshrl/parallel/precision.py), and the speedup of more threads per
rank separately, in the same dtype (meshrl/profile/threads.py): a rank of a run gets ``train.threads``
threads, by default the usable cores split between the machine's ranks (meshrl/cores.py), and the
planner scales the one-thread figures by the measured speedup for that count.
torch.compile against eager per layer, in the same dtype: meshrl/profile/compile.py (full profile only).
Collectives run in real gloo process groups started with torch.multiprocessing; every process
group has a timeout and every child is joined with a deadline and killed if it overruns.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import UserError
from ..host_memory import physical_bytes
from ..parallel.precision import torch_dtype
from .compile import measure_compile
from .cores import measure_cores
from .host import measure_host_gap
from .layers import linear_fit, measure_layers, measure_optimizer, median_time
from .pipeline import measure_pipeline_hop
from .threads import measure_thread_scaling

HIDDEN_FULL = (128, 768, 2048, 4096)  # tiny, small, and two larger widths (7B is 4096)
HIDDEN_QUICK = (128,)
GROUPS_FULL = (2, 4)
GROUPS_QUICK = (2,)
PG_TIMEOUT_S = 60
SIZES = (4096, 1 << 18, 1 << 22)  # bytes per rank: from latency-bound to bandwidth-bound


def measure_matmul(hidden: tuple[int, ...], reps: int, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """FLOP/s of [tokens, h] x [h, 4h / 3 * 2] (a decoder MLP's shape) per hidden size, in ``dtype``."""
    out = {}
    for h in hidden:
        tokens = 256
        a, b = torch.randn(tokens, h, dtype=dtype), torch.randn(h, max(8, (8 * h) // 3), dtype=dtype)
        t = median_time(lambda a=a, b=b: a @ b, reps)
        out[str(h)] = 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / t
    return out


def measure_mem_bw(nbytes: int, reps: int) -> float:
    """Bytes/s of a tensor copy (each byte read once and written once)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), reps)
    return 2.0 * nbytes / t


def _worker(rank: int, world: int, port: int, reps: int, out_path: str, sizes: tuple[int, ...] = SIZES
            ) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=PG_TIMEOUT_S))
    try:
        res: dict[str, dict] = {"all_reduce": {}, "all_gather": {}, "p2p": {}}
        for kind in res:
            pts = []
            for nbytes in sizes:
                x = torch.ones(nbytes // 4)
                if kind == "all_reduce":
                    fn, moved = (lambda x=x: dist.all_reduce(x)), 2 * (world - 1) / world * nbytes
                elif kind == "all_gather":
                    parts = [torch.empty_like(x) for _ in range(world)]
                    fn, moved = (lambda x=x, p=parts: dist.all_gather(p, x)), (world - 1) * nbytes
                else:
                    def fn(x=x) -> None:  # ping-pong between ranks 0 and 1, half a round trip each
                        if rank == 0:
                            dist.send(x, 1)
                            dist.recv(x, 1)
                        elif rank == 1:
                            dist.recv(x, 0)
                            dist.send(x, 0)
                    moved = nbytes
                dist.barrier()
                t = median_time(fn, reps)
                pts.append((moved, t / 2 if kind == "p2p" else t))
            res[kind] = linear_fit(pts, "sec_per_byte")
        if rank == 0:
            Path(out_path).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_collectives(world: int, reps: int, timeout_s: float, sizes: tuple[int, ...] = SIZES
                        ) -> dict[str, dict]:
    """Spawn ``world`` gloo ranks; return {kind: {latency_s, sec_per_byte}}. Children that do not
    finish within ``timeout_s`` are killed and the failure is reported, never waited on forever."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "coll.json")
        ctx = mp.start_processes(_worker, args=(world, _free_port(), reps, out, sizes), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise UserError(f"profiling collectives on {world} gloo ranks took over {timeout_s:.0f} s")
        except mp.ProcessRaisedException as e:
            raise UserError(f"profiling collectives on {world} gloo ranks failed: {e}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return json.loads(Path(out).read_text())


def profile(quick: bool = False, timeout_s: float = 120.0) -> dict:
    """The profile dict (see meshrl/plan/hardware_profile.py: from_profile)."""
    reps = 2 if quick else 5
    dtype = torch_dtype("auto", cuda=False)  # what a run on this CPU computes in
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        matmul = measure_matmul(HIDDEN_QUICK if quick else HIDDEN_FULL, reps, dtype)
        mem_bw = measure_mem_bw((16 if quick else 256) << 20, reps)
        layers = measure_layers(quick, reps, dtype)  # 1- and DEEP-layer models timed alternately
        optimizer = measure_optimizer(reps, mem_bw)  # per tensor: the runtime AdamW's kernels and Python
        # compiled / eager per layer (train.compile, gen.compile); not in --quick: the compiles take minutes
        compiled = {} if quick else {"compile": measure_compile(reps, dtype=dtype)}
    finally:
        torch.set_num_threads(prev)
    colls: dict[str, dict] = {"all_reduce": {}, "all_gather": {}, "p2p": {}}
    for world in GROUPS_QUICK if quick else GROUPS_FULL:
        res = measure_collectives(world, reps, timeout_s, SIZES[::2] if quick else SIZES)
        for kind, fit in res.items():
            if kind != "p2p" or world == 2:
                colls[kind][str(world)] = fit
    cores = measure_cores(quick, timeout_s)  # cores, threads_per_rank (1), contention
    scaling = measure_thread_scaling(cores["cores"], quick, reps, dtype)  # speedup of t threads per rank
    pipeline = measure_pipeline_hop(reps, timeout_s)  # per stage boundary of a decoding step
    host_gap = measure_host_gap(quick, timeout_s)  # the runtime's host time per call
    mem = physical_bytes()
    return {"version": 1, "device": "cpu", "host": platform.node(), "cpus": os.cpu_count(), **cores,
            "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."),
            "dtype_bytes": dtype.itemsize,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": quick,
            "matmul": matmul, "layers": layers, "mem_bw": mem_bw, "mem_bytes": mem, "collectives": colls,
            "pipeline": pipeline, "optimizer": optimizer, "host_gap": host_gap, "thread_scaling": scaling,
            **compiled}
