"""Data parallelism: gradient reduction, whole-model gradient clipping, ZeRO-1 AdamW.

Loss normalisation is the caller's: a micro-batch's loss is its token sum divided by the token
count of the WHOLE mini-batch (all micro-batches on all dp ranks), so summing gradients over
micro-batches (autograd accumulation) and over dp ranks (all-reduce SUM) gives the mini-batch
gradient whatever the split, up to summation order.

ZeRO-1: every dp rank keeps AdamW state for 1/dp of each (flattened) parameter, updates that chunk
with torch's own AdamW, and an all-gather puts the updated chunks back into every replica. The
update is element-wise, so a chunk's result is bit-identical to updating the whole tensor.
We do not use FSDP2 here because the local shards must stay plain tensors equal to the ShardMap
slices (the reallocation executor swaps them), and because FSDP2 shards parameters (ZeRO-3), not
only optimizer state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..layout.shardmap import ShardMap
from . import comm
from .groups import Axis, RankGroups
from ..model.numerics import wide_dtype


IMPLS = ("fused", "foreach", "loop")
BUCKET_BYTES = 25 << 20  # gradient all-reduce and ZeRO-1 all-gather bucket (PyTorch DDP's default size)


def all_reduce_grads(params: list[nn.Parameter], axis: Axis, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Sum the gradients of ``params`` over ``axis``, one collective per flat bucket of about
    ``bucket_bytes`` (few collectives, bounded extra memory)."""
    if axis.group is None or not params:
        return
    bucket: list[torch.Tensor] = []
    size = 0
    for i, p in enumerate(params):
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= bucket_bytes or i == len(params) - 1:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            comm.all_reduce(flat, axis.group)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            bucket, size = [], 0


def counted_names(sm: ShardMap, rank: int) -> set[str]:
    """Parameters whose gradient this rank counts in the global norm: a slice held by several ranks
    of one dp replica (norms across tp, replicated KV heads, a tied embedding's two stages) is
    counted only by its first holder in mesh order."""
    dp_i = sm.placement.coords_of(rank)[0]
    replica = [r for r in sm.placement.mesh.ranks if sm.placement.coords_of(r)[0] == dp_i]  # mesh order
    # only the replica's ranks are asked (not every holder of the mesh): a MoE model has thousands
    # of tensors, and every rank builds this set for each model it holds
    return {name for name, sl in sm.params_of(rank).items()
            if next(r for r in replica if sm.slice_of(r, name) == sl) == rank}


def clip_grad_norm(named: dict[str, nn.Parameter], counted: set[str], mp: Axis, max_norm: float) -> float:
    """Scale all gradients so the norm of the whole model's gradient is at most ``max_norm``, as
    torch.nn.utils.clip_grad_norm_ does on one process (per-tensor norms, then the norm of those).
    Returns the norm before clipping."""
    sq = torch.zeros((), dtype=torch.float64)
    for name in sorted(counted):
        sq += torch.linalg.vector_norm(named[name].grad, 2).double() ** 2
    total_sq = float(sq.item())
    if mp.group is not None:  # a float64 statistic: the control plane
        total_sq = comm.reduce_floats([total_sq], mp.group)[0]
    total = math.sqrt(total_sq)
    coef = min(max_norm / (total + 1e-6), 1.0)
    if coef < 1.0:
        for p in {id(p): p for p in named.values()}.values():
            p.grad.mul_(coef)
    return total


@dataclass(frozen=True)
class AdamWConfig:
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # <= 0: no clipping
    # (parameter-name prefix, lr multiplier): e.g. a reward model's fresh score head learns faster
    lr_scales: tuple[tuple[str, float], ...] = ()
    impl: str | None = None  # torch AdamW's kernels: fused | foreach | loop; None: fused (see ZeroAdamW)


class ZeroAdamW:
    """AdamW whose state is sharded over the dp axis (ZeRO stage 1), with fp32 master weights.

    fp32 parameters: each rank's chunk is a view into its own parameter storage, so torch's AdamW
    updates the parameter in place and, with dp = 1, nothing is copied at all (4 + 4 + 8/dp bytes
    per parameter: weights, gradients, m and v). Lower-precision (bf16) parameters: the chunk is an
    fp32 *master* copy of this rank's 1/dp of the parameter; the step reads the bf16 gradient chunk
    as fp32, updates the master, and rounds it back into the bf16 parameter before the all-gather
    (2 + 2 + 12/dp bytes: bf16 weights and gradients, master + m + v sharded), as the planner prices."""

    def __init__(self, params: list[nn.Parameter], dp: Axis, cfg: AdamWConfig, names: list[str] | None = None
                 ) -> None:
        """``names`` (one per param) select the parameters that ``cfg.lr_scales`` applies to."""
        first: dict[int, tuple[str, nn.Parameter]] = {}
        for n, p in zip(names or [""] * len(params), params, strict=True):
            first.setdefault(id(p), (n, p))  # a tied parameter once, at its first place
        self.params = [p for _, p in first.values()]
        scales = [next((x for pre, x in cfg.lr_scales if n.startswith(pre)), 1.0) for n, _ in first.values()]
        self.dp = dp
        self.chunks: list[nn.Parameter] = []
        self.bounds: list[tuple[int, int, int]] = []  # (lo, hi, padded chunk size)
        for p in self.params:
            n = p.numel()
            size = -(-n // dp.size)
            lo, hi = min(dp.index * size, n), min((dp.index + 1) * size, n)
            self.bounds.append((lo, hi, size))
            view = p.detach().view(-1)[lo:hi]
            # the fp32 master of a low-precision parameter; a float32 or float64 one is its own master
            self.chunks.append(nn.Parameter(view if p.dtype == wide_dtype(p.dtype) else view.float().clone()))
        groups = [{"params": [c for c, x in zip(self.chunks, scales, strict=True) if x == scale], "lr": cfg.lr * scale}
                  for scale in dict.fromkeys(scales)]
        # torch's fused kernel: on a GPU one launch per step for all chunks (launches dominate
        # there); on a CPU a fraction of the per-tensor loop's time, with foreach no faster than the
        # loop, and the same weights (`python bench/adamw_impl.py`; its figures in docs/gpu.md,
        # "AdamW kernels"). meshrl/profile/layers.py times this very class, so a CPU profile prices
        # what runs.
        self.impl = cfg.impl or "fused"
        if self.impl not in IMPLS:
            raise ValueError(f"AdamW impl {self.impl!r}: expected one of {IMPLS}")
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                     foreach=self.impl == "foreach", fused=self.impl == "fused" or None)
        self._gather_buckets = self._buckets()
        self._init_state()

    @torch.no_grad()
    def _init_state(self) -> None:
        """AdamW's moments made now rather than at the first step (what torch's AdamW would make
        then, zeros and step 0: the same numbers): the rank holds its whole optimizer state from
        the start, so a plan that does not fit fails when the models are built, not mid-run, and
        the memory the planner predicts is there in every call."""
        for g in self.opt.param_groups:
            for c in g["params"]:
                # the fused kernel reads the step count on the parameter's device, the others on the host
                step_dev = c.device if self.impl == "fused" else "cpu"
                self.opt.state[c] = {"step": torch.tensor(0.0, dtype=torch.float32, device=step_dev),
                                     "exp_avg": torch.zeros_like(c, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(c, memory_format=torch.preserve_format)}

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's chunks (in place, in the parameters) from the already reduced
        gradients, then all-gather the other ranks' chunks."""
        for p, chunk, (lo, hi, _) in zip(self.params, self.chunks, self.bounds, strict=True):
            g = p.grad.view(-1)[lo:hi]
            chunk.grad = g if g.dtype == chunk.dtype else g.to(chunk.dtype)
        self.opt.step()
        gather = self.dp.group is not None
        for p, chunk, (lo, hi, _) in zip(self.params, self.chunks, self.bounds, strict=True):
            if p.dtype != chunk.dtype and not gather:  # master -> the low-precision parameter (round to nearest)
                p.detach().view(-1)[lo:hi].copy_(chunk)
            chunk.grad = None
        if not gather:
            return
        for items in self._gather_buckets:  # rounds the masters into the all-gather's input, and so into p
            self._gather(items)

    def _buckets(self) -> list[list[tuple[nn.Parameter, nn.Parameter, tuple[int, int, int]]]]:
        """Consecutive parameters of one dtype, about BUCKET_BYTES of chunks each. Why buckets and
        not one all-gather per tensor: the updated chunks are small and each collective pays its
        latency, and a model has many small tensors (docs/planner.md, "Estimator accuracy on 2 and
        4 ranks", has the measurement)."""
        out: list[list] = []
        size = 0
        for p, c, b in zip(self.params, self.chunks, self.bounds, strict=True):
            nbytes = b[2] * p.element_size()
            if not out or out[-1][0][0].dtype != p.dtype or size + nbytes > BUCKET_BYTES:
                out.append([])
                size = 0
            out[-1].append((p, c, b))
            size += nbytes
        return out

    def _gather(self, items: list[tuple[nn.Parameter, nn.Parameter, tuple[int, int, int]]]) -> None:
        """One all-gather of this rank's chunks of ``items`` (each padded to its chunk size), then
        every rank's chunk copied back into its place in each parameter, this rank's own included.
        The input is read from the chunks: a float32 parameter's chunk is its own slice, a bf16
        one's fp32 master is rounded to nearest into the bf16 input, as a copy into the parameter
        would round it (so the step makes no separate master -> parameter copy)."""
        p0 = items[0][0]
        mine = torch.zeros(sum(size for _, _, (_, _, size) in items), dtype=p0.dtype, device=p0.device)
        off = 0
        for _, chunk, (lo, hi, size) in items:
            mine[off:off + hi - lo] = chunk
            off += size
        gathered = mine.new_empty(self.dp.size, mine.numel())  # row r: rank r's chunks
        comm.all_gather(list(gathered.unbind(0)), mine, self.dp.group)
        off = 0
        for p, _, (_, _, size) in items:
            # Rank r's chunk is flat[r * size:(r + 1) * size]: the whole ones in one strided copy
            # and a short last one (not one copy per rank: a model has many tensors, and a copy
            # is a kernel launch on a GPU and a fake op in a dry run).
            flat, n = p.view(-1), p.numel()
            whole = n // size if size else 0
            flat[:whole * size].view(whole, size).copy_(gathered[:whole, off:off + size])
            if n > whole * size:
                flat[whole * size:].copy_(gathered[whole, off:off + n - whole * size])
            off += size

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        """AdamW's state, plus the fp32 master chunks when the parameters are not fp32."""
        out = self.opt.state_dict()
        if any(p.dtype != c.dtype for p, c in zip(self.params, self.chunks, strict=True)):
            out = {**out, "master": [c.detach().clone() for c in self.chunks]}
        return out

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        master = state.pop("master", None)
        self.opt.load_state_dict(state)
        if master is not None:
            for c, m in zip(self.chunks, master, strict=True):
                c.copy_(m)


def sync_grads(named: dict[str, nn.Parameter], groups: RankGroups, kv_names: list[str],
               tied_embedding: bool, bucket_bytes: int = BUCKET_BYTES, tp_names: list[str] = (),
               dp_done: bool = False) -> None:
    """Make every local gradient the full mini-batch gradient of its slice:
    tied embedding copies summed over the first/last stage, replicated KV heads summed over their
    holders, replicated weights used inside the tp region (Qwen3's per-head q/k norms, each rank
    seeing only its heads: ``tp_names``) summed over tp, and everything summed over dp (unless
    ``dp_done``: the overlapped reduction of parallel/overlap.py did it during the backward; the
    sums commute, so the order changes only rounding)."""
    for p in named.values():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if tied_embedding and groups.tied is not None:  # pp > 1 and this is the first or last stage
        all_reduce_grads([named["model.embed_tokens.weight"]], groups.tied)
    all_reduce_grads([named[n] for n in kv_names], groups.kv)
    all_reduce_grads([named[n] for n in tp_names], groups.tp)
    if not dp_done:
        all_reduce_grads(list({id(p): p for p in named.values()}.values()), groups.dp, bucket_bytes)
