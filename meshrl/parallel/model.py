"""``ParallelModel``: one model on one placement (dp x tp x pp on a mesh), as one rank sees it.

Data contract (every method): each rank of data-parallel replica d receives replica d's rows of the
batch (the same rows on all its tp and pp ranks); the caller splits and gathers. Outputs of a
forward (logits, log-probs, values) live on the last pipeline stage, identical on its tp ranks
(logits stay vocabulary-sharded); ``train_step`` returns the whole mini-batch's loss on every rank;
``generate`` returns the replica's completions on every rank of the replica.

    pm = ParallelModel.from_state(cfg, placement, GroupCache(), full_state, optim=AdamWConfig(lr=1e-4))
    out = pm.train_step(batch, loss_fn, micro_batches=2)    # loss_fn(HeadOutputs, micro_batch) -> scalar
    state = pm.local_state()                                # {HF name: tensor}, exactly the ShardMap slices
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import torch
from torch import nn

from ..errors import UserError
from ..layout.mesh import Placement
from ..layout.shardmap import ShardMap, check_shardable, shard_map
from ..model import worst_case
from ..model.config import ModelConfig
from ..model.generation import GenerationConfig, GenerationOutput
from ..model.heads import Batch, HeadOutputs, LossFn, pad_columns, pad_head, split_micro, trim_columns
from ..model.moe import set_moe_aux
from . import comm
from .data import BUCKET_BYTES, AdamWConfig, ZeroAdamW, clip_grad_norm, counted_names, sync_grads
from .generate import pipelined_generate
from .overlap import GradBuckets
from .groups import GroupCache, RankGroups
from .pipeline import Pipe, infer, train_1f1b
from .stage import SliceLoader, Stage, loader_from_state
from .tensor import vocab_parallel_logprobs
from ..model.compiled_layers import compile_layers as compile_


class ParallelModel:
    """This rank's stage of a CausalLM (or ValueModel with ``value_head``) under ``placement``."""

    def __init__(self, cfg: ModelConfig, groups: RankGroups, load: SliceLoader, value_head: bool = False,
                 optim: AdamWConfig | None = None, timeout_s: float = 300.0,
                 activation_checkpointing: bool = False, grad_bucket_bytes: int = BUCKET_BYTES,
                 overlap_grad_reduce: bool = True, compile_layers: bool = False) -> None:
        """Build this rank's part; ``groups`` from ``GroupCache.for_placement(placement,
        cfg.num_key_value_heads)`` (which every rank of the world calls). See ``create``."""
        placement = groups.placement
        self.cfg, self.placement, self.value_head = cfg, placement, value_head
        self.sm: ShardMap = shard_map(cfg, placement, value_head)
        self.groups = groups
        self.stage = Stage(self.sm, self.groups, load, comm.compute_device())
        if compile_layers and placement.layout.tp == 1:  # tp's all-reduces stay out of compiled code
            compile_(self.stage.model.layers)
        if activation_checkpointing:  # after compiling: the recomputed forward is the compiled one
            self.stage.checkpoint_activations()
        self.pipe = Pipe(self.groups.pp, timeout_s, self.stage.device)
        self.named: dict[str, nn.Parameter] = dict(self.stage.param_of)
        self.optim_cfg = optim
        self.optimizer = ZeroAdamW(list(self.named.values()), self.groups.dp, optim,
                                   names=list(self.named)) if optim else None
        self._counted = counted_names(self.sm, self.groups.rank)
        kv_split = placement.layout.tp > cfg.num_key_value_heads
        self._kv_names = [n for n in self.named if kv_split and (".k_proj." in n or ".v_proj." in n)]
        tp_split = placement.layout.tp > 1
        self._tp_names = [n for n in self.named if tp_split and (".q_norm." in n or ".k_norm." in n)]
        self._tied = cfg.tie_word_embeddings and not value_head
        self.dp_bucket_bytes = grad_bucket_bytes  # gradient all-reduce bucket (default: PyTorch DDP's size)
        # the dp all-reduce runs bucket by bucket during the last micro-batch's backward (overlap.py)
        self.overlap_grad_reduce = overlap_grad_reduce
        self._grad_buckets: GradBuckets | None = None

    @classmethod
    def create(cls, cfg: ModelConfig, placement: Placement, cache: GroupCache, load: SliceLoader | None,
               **kw) -> "ParallelModel | None":
        """Call on EVERY rank of the world (group creation is collective): returns the model on the
        mesh's ranks and None elsewhere. ``load(name, slice)`` is only called on mesh ranks."""
        check_shardable(cfg, placement)
        groups = cache.for_placement(placement, cfg.num_key_value_heads)
        return None if groups is None else cls(cfg, groups, load, **kw)

    @classmethod
    def from_state(cls, cfg: ModelConfig, placement: Placement, cache: GroupCache,
                   state: Mapping[str, torch.Tensor] | None, **kw) -> "ParallelModel | None":
        """``create`` from a full (HF-named) state dict, e.g. ``build_model(cfg, seed).state_dict()``
        (ranks outside the mesh may pass None)."""
        return cls.create(cfg, placement, cache, None if state is None else loader_from_state(state), **kw)

    # ---- forward passes --------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.named.values())).dtype

    def _hidden_shape(self, micro: list[dict[str, torch.Tensor]]) -> Callable[[int], tuple[int, ...]]:
        return lambda i: (*micro[i]["input_ids"].shape, self.cfg.hidden_size)

    def _run_stage(self, mb: Batch, x: torch.Tensor | None) -> torch.Tensor:
        return self.stage(mb["input_ids"] if self.stage.first else x, mb["attention_mask"])

    def _head(self, h: torch.Tensor, mb: Batch, entropy: bool) -> HeadOutputs:
        if self.value_head:
            return HeadOutputs(values=self.stage.head(h).squeeze(-1))
        logits = self.stage.head(h[:, :-1])  # [b, S-1, V/tp]
        lp, ent = vocab_parallel_logprobs(logits, mb["input_ids"][:, 1:], self.groups.tp,
                                          self.stage.vocab_start, entropy)
        return HeadOutputs(logprobs=lp, entropy=ent)

    def _on_device(self, batch: Batch) -> Batch:
        """The call's inputs on this rank's compute device (a no-op when they are there already)."""
        dev = self.stage.device
        return {k: v.to(dev, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def _forward(self, batch: Batch, micro_batches: int, last_fn: Callable[[torch.Tensor, Batch], torch.Tensor],
                 trim: bool = True) -> torch.Tensor | None:
        """``last_fn(hidden, model inputs)`` on each micro-batch; with ``trim`` the model runs on the
        micro-batch's real columns only (model/heads.py) and ``last_fn`` pads its result back."""
        micro = split_micro(self._on_device(batch), micro_batches)
        cut = [trim_columns(mb) if trim else (mb, 0) for mb in micro]
        run = [c[0] for c in cut]

        def step(i: int, x: torch.Tensor | None) -> torch.Tensor:
            h = self._run_stage(run[i], x)
            return last_fn(h, run[i], cut[i][1]) if self.stage.last else h

        with torch.no_grad():
            outs = infer(self.pipe, len(micro), step, self._hidden_shape(run), self.dtype)
        return torch.cat(outs) if outs else None

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batches: int = 1
               ) -> torch.Tensor | None:
        """-> this tp rank's vocabulary slice of the logits [B, S, V/tp] (last stage; None elsewhere)."""
        if self.value_head:
            raise UserError("logits: this is a value model; use values()")
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        return self._forward(batch, micro_batches, lambda h, mb, lo: self.stage.head(h), trim=False)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batches: int = 1,
                 entropy: bool = False) -> torch.Tensor | None:
        """-> log-probs [B, S-1] (with entropy: [2, B, S-1]) on the last stage; None elsewhere."""
        if self.value_head:
            raise UserError("logprobs: this is a value model; use values()")

        width = input_ids.shape[1]

        def last(h: torch.Tensor, mb: Batch, lo: int) -> torch.Tensor:
            out = pad_head(self._head(h, mb, entropy), lo, width)
            return torch.stack([out.logprobs, out.entropy], 1) if entropy else out.logprobs

        out = self._forward({"input_ids": input_ids, "attention_mask": attention_mask}, micro_batches, last)
        return out.transpose(0, 1) if out is not None and entropy else out

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batches: int = 1
               ) -> torch.Tensor | None:
        """-> values [B, S] on the last stage (value models); None elsewhere."""
        if not self.value_head:
            raise UserError("values: this is a language model; use logprobs()")
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        width = input_ids.shape[1]
        return self._forward(batch, micro_batches,
                             lambda h, mb, lo: pad_columns(self.stage.head(h).squeeze(-1), lo, width))

    # ---- training -------------------------------------------------------------------------
    def forward_backward(self, batch: Batch, loss_fn: LossFn, micro_batches: int = 1,
                         entropy: bool = False, moe_aux: float = 0.0) -> float:
        """Accumulate the mini-batch gradient into every local parameter's ``.grad`` (complete and
        identical on the holders of a slice, after the tied/kv/dp reductions). ``loss_fn`` must
        normalise by the whole mini-batch (see data.py). Returns the mini-batch loss on every rank."""
        micro = split_micro(self._on_device(batch), micro_batches)
        cut = [trim_columns(mb) for mb in micro]  # the model runs on each micro-batch's real columns
        width = batch["input_ids"].shape[1]

        def step(i: int, x: torch.Tensor | None) -> torch.Tensor:
            run, lo = cut[i]
            h = self._run_stage(run, x)
            return loss_fn(pad_head(self._head(h, run, entropy), lo, width), micro[i]) if self.stage.last else h

        buckets = self._overlap_buckets()
        if buckets is not None:
            buckets.prepare()
        set_moe_aux(self.stage, moe_aux)  # the router balance loss, injected at each MoE layer
        try:
            # a dry run's alike micro-batches: those 1F1B needs to reach its most in flight (model/worst_case.py)
            n = worst_case.pipelined_micro_batches(len(micro), self.pipe.axis.size)
            losses = train_1f1b(self.pipe, n, step, self._hidden_shape([c[0] for c in cut]), self.dtype,
                                before_last_backward=None if buckets is None else buckets.arm)
        finally:
            set_moe_aux(self.stage, 0.0)
        if buckets is not None:
            buckets.finish()  # the dp sums are complete here
        sync_grads(self.named, self.groups, self._kv_names, self._tied, self.dp_bucket_bytes, self._tp_names,
                   dp_done=buckets is not None)
        # the loss is a float64 statistic: summed and broadcast on the control plane
        loss = float(torch.stack(losses).double().sum().item()) if losses else 0.0
        if self.groups.dp.group is not None:
            loss = comm.reduce_floats([loss], self.groups.dp.group)[0]
        if self.groups.pp.group is not None:
            loss = comm.broadcast_floats([loss], self.groups.pp.ranks[-1], self.groups.pp.group)[0]
        return loss

    def _overlap_buckets(self) -> GradBuckets | None:
        """The overlapped dp reduction's buckets (made at the first use, with the current bucket
        size), or None when there is no dp axis or the overlap is off."""
        if not self.overlap_grad_reduce or self.groups.dp.group is None:
            return None
        b = self._grad_buckets
        if b is None or b.bucket_bytes != self.dp_bucket_bytes:
            if b is not None:
                b.remove()
            params = list({id(p): p for p in self.named.values()}.values())
            b = self._grad_buckets = GradBuckets(params, self.groups.dp, self.dp_bucket_bytes, self.pipe.timeout)
        return b

    def optimizer_step(self) -> float:
        """Clip the whole model's gradient norm, update with ZeRO-1 AdamW, clear the gradients.
        Returns the gradient norm before clipping (same on every rank)."""
        if self.optimizer is None:
            raise UserError("this ParallelModel was built without an optimizer (optim=AdamWConfig(...))")
        # max_grad_norm <= 0 means no clipping; the norm is still measured (as LocalHandle reports it).
        clip = self.optim_cfg.max_grad_norm if self.optim_cfg.max_grad_norm > 0 else math.inf
        norm = clip_grad_norm(self.named, self._counted, self.groups.mp, clip)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return norm

    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batches: int = 1, entropy: bool = False
                   ) -> dict[str, float]:
        loss = self.forward_backward(batch, loss_fn, micro_batches, entropy)
        return {"loss": loss, "grad_norm": self.optimizer_step()}

    def generate(self, prompts: list[list[int]], gen_cfg: GenerationConfig, seeds: list[int] | None = None,
                 micro_batches: int | None = None) -> GenerationOutput:
        """Pipelined / tensor-parallel generation of this replica's prompts; see generate.py.
        Sampling needs per-row ``seeds``; the output is the same on every rank of the replica.
        ``micro_batches`` in flight through the pipeline (the runtime passes the plan's count for
        the call): None = pp, each stage working on its own one; 1 = the stages take turns on the
        whole batch (fewer passes: cheaper where a pass costs mostly its fixed overhead)."""
        if self.value_head:
            raise UserError("generate: a value model cannot generate")
        return pipelined_generate(self.stage, self.pipe, self.groups.tp, prompts, gen_cfg, seeds, micro_batches)

    # ---- parameters, for reallocation and checkpoints ---------------------------------------
    def local_state(self) -> dict[str, torch.Tensor]:
        """{HF name: this rank's shard} with exactly the ShardMap slices (views of the live params)."""
        return {name: p.detach() for name, p in self.named.items()}

    def local_grads(self) -> dict[str, torch.Tensor]:
        return {name: p.grad for name, p in self.named.items() if p.grad is not None}

    @torch.no_grad()
    def load_local_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite this rank's shards (same names and shapes as ``local_state``)."""
        if set(state) != set(self.named):
            missing, extra = sorted(set(self.named) - set(state)), sorted(set(state) - set(self.named))
            raise UserError(f"load_local_state on rank {self.groups.rank}: missing {missing}, unexpected {extra}")
        for name, t in state.items():
            p = self.named[name]
            if tuple(t.shape) != tuple(p.shape):
                raise UserError(f"load_local_state: {name} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
            p.copy_(t)  # in place: the optimizer's chunks are views of these parameters

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Gather the full model onto the mesh's first rank (returned there; None elsewhere).
        Only data-parallel replica 0 takes part; the others return at once."""
        return gather_full_state(self.sm, self.groups, self.local_state(), self.pipe.timeout)


def gather_full_state(sm: ShardMap, groups: RankGroups, local: Mapping[str, torch.Tensor], timeout
                      ) -> dict[str, torch.Tensor] | None:
    """Each distinct slice of replica 0 is sent once by its first holder to the mesh's first rank."""
    if groups.dp.index != 0:
        return None
    dst = sm.placement.mesh.ranks[0]
    replica0 = {r for r in sm.placement.mesh.ranks if sm.placement.coords_of(r)[0] == 0}
    out = gather_tensors(sm, list(sm.shapes), replica0, dst, groups, groups.mp.group, local, timeout)
    return out if groups.rank == dst else None


def gather_tensors(sm: ShardMap, names: list[str], ranks: set[int], dst: int, groups: RankGroups, group,
                   local: Mapping[str, torch.Tensor], timeout, to_host: bool = False) -> dict[str, torch.Tensor]:
    """Assemble each tensor of ``names`` whole on rank ``dst`` from the distinct slices ``ranks`` hold
    (each sent once, by its first holder in ``ranks``, on ``group``, which holds them all), one
    tensor at a time. -> {name: tensor} on ``dst`` (moved to the host as it is made with
    ``to_host``: the device holds one whole tensor at a time); {} on the other ranks. The one
    gather behind ``full_state_dict`` and the sharded HF export (runtime/export.py)."""
    me = groups.rank
    like = next(iter(local.values()))
    out: dict[str, torch.Tensor] = {}
    pending = []
    for name in names:
        full = torch.empty(sm.shapes[name], dtype=like.dtype, device=like.device) if me == dst else None
        seen: set = set()
        for r, sl in sm.holders(name):
            if r not in ranks or sl in seen:
                continue
            seen.add(sl)
            idx = tuple(slice(a, b) for a, b in sl)
            if r == me == dst:
                full[idx] = local[name]
            elif me == dst:
                buf = torch.empty(tuple(b - a for a, b in sl), dtype=full.dtype, device=full.device)
                comm.irecv(buf, r, group).wait(timeout)
                full[idx] = buf
            elif r == me:
                t = local[name].contiguous()
                pending.append((comm.isend(t, dst, group), t))
        if full is not None:
            out[name] = full.cpu() if to_host else full
    for work, _ in pending:
        work.wait(timeout)
    return out
