"""Tensor parallelism, Megatron / picotron style: column-parallel q/k/v, gate/up; row-parallel o/down;
vocabulary-parallel embedding, LM head, log-probabilities and entropy.

Why our own autograd functions instead of DTensor / ``parallelize_module``: the local shards must be
exactly the ShardMap slices (plain tensors the reallocation executor can overwrite), GQA with
tp > KV heads *replicates* KV heads (each tp rank holds the one KV head its query heads use), which
is not a placement DTensor's Shard/Replicate can express for k_proj/v_proj, and RLHF needs per-token
log-probs of chosen tokens from vocabulary-sharded logits without gathering them. Two identities
do all the work (Megatron's f and g):

    copy_to_tp:      forward identity,   backward all-reduce   (before a column-parallel layer)
    reduce_from_tp:  forward all-reduce, backward identity     (after a row-parallel layer)

Everything downstream of ``reduce_from_tp`` is replicated on the tp ranks, so every tp rank
computes the same loss, and replicated parameters (norms, ``score``) get identical, complete
gradients without any extra communication. The exception is a replicated KV head: each of its
holders sees only its own query heads, so those k/v gradients are summed over the ``kv`` axis.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import comm
from .groups import Axis
from ..model.numerics import wide


def _all_reduce(x: torch.Tensor, axis: Axis, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    if axis.group is not None:
        comm.all_reduce(x, axis.group, op)
    return x


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, axis: Axis) -> torch.Tensor:  # type: ignore[override]
        ctx.axis = axis
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return _all_reduce(g.contiguous().clone(), ctx.axis), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, axis: Axis) -> torch.Tensor:  # type: ignore[override]
        return _all_reduce(x.contiguous().clone(), axis)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return g, None


class _CopyManyToTP(torch.autograd.Function):
    """copy_to_tp for several tensors with ONE backward all-reduce of all their gradients, so the
    collective order cannot depend on which gradient autograd finishes first on a rank."""

    @staticmethod
    def forward(ctx, axis: Axis, *xs: torch.Tensor):  # type: ignore[override]
        ctx.axis, ctx.shapes = axis, [(x.shape, x.dtype) for x in xs]
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *gs: torch.Tensor):  # type: ignore[override]
        device = next(g.device for g in gs if g is not None) if any(g is not None for g in gs) else None
        flat = torch.cat([wide(g if g is not None else torch.zeros(s, dtype=dt, device=device)).reshape(-1)
                          for g, (s, dt) in zip(gs, ctx.shapes, strict=True)])
        _all_reduce(flat, ctx.axis)
        out, off = [], 0
        for s, dt in ctx.shapes:
            n = s.numel()
            out.append(flat[off:off + n].view(s).to(dt))
            off += n
        return (None, *out)


def copy_many_to_tp(axis: Axis, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return xs if axis.group is None else _CopyManyToTP.apply(axis, *xs)


def copy_to_tp(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    return x if axis.group is None else _CopyToTP.apply(x, axis)


def reduce_from_tp(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    return x if axis.group is None else _ReduceFromTP.apply(x, axis)


def gather_vocab(local: torch.Tensor, axis: Axis) -> torch.Tensor:
    """[..., V/tp] on every tp rank -> full [..., V] (no autograd; for sampling and checks)."""
    if axis.group is None:
        return local
    parts = [torch.empty_like(local) for _ in range(axis.size)]
    comm.all_gather(parts, local.contiguous(), axis.group)
    return torch.cat(parts, dim=-1)


class VocabParallelEmbedding(nn.Module):
    """Rows [vocab_start, vocab_start + V/tp) of the embedding; ids elsewhere give zeros, and the
    all-reduce adds the one rank's row that owns each id (exact: one non-zero term per element)."""

    def __init__(self, weight: torch.Tensor, vocab_start: int, axis: Axis) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.vocab_start = vocab_start
        self.axis = axis

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, S] -> hidden [B, S, hidden] (replicated on the tp ranks)."""
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        h = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        h = h.masked_fill(outside[..., None], 0.0)
        return reduce_from_tp(h, self.axis)


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, axis: Axis, vocab_start: int,
                            entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of ``targets`` (and optionally the entropy) from vocabulary-sharded logits.

    logits [B, S, V/tp] (this rank's vocabulary slice), targets [B, S] (global ids) ->
    logprobs [B, S] float32 and entropy [B, S] float32 or None, identical on every tp rank.
    Differentiable; no rank ever holds more than its own V/tp columns."""
    z = wide(logits)
    if axis.group is None:  # one tp rank: exactly what the single-process model computes
        lse = torch.logsumexp(z, dim=-1)
        logprobs = z.gather(-1, targets[..., None]).squeeze(-1) - lse
        if not entropy:
            return logprobs, None
        return logprobs, lse - (z.softmax(-1) * z).sum(-1)
    # The max is only a shift for stability; it carries no gradient.
    m = _all_reduce(z.detach().amax(-1), axis, dist.ReduceOp.MAX)
    shifted = z - m[..., None]
    exp = shifted.exp()
    sumexp = reduce_from_tp(exp.sum(-1), axis)
    lse = sumexp.log()
    local = targets - vocab_start
    inside = (local >= 0) & (local < z.shape[-1])
    picked = shifted.gather(-1, local.clamp(0, z.shape[-1] - 1)[..., None]).squeeze(-1)
    picked = reduce_from_tp(picked * inside, axis)
    logprobs = picked - lse
    if not entropy:
        return logprobs, None
    # H = log Z - sum_v p_v * z_v  (both relative to the same shift m)
    mean_z = reduce_from_tp((exp * shifted).sum(-1), axis) / sumexp
    return logprobs, lse - mean_z


def register_tp_hooks(layers: nn.ModuleList, head: nn.Module | None, axis: Axis) -> None:
    """Wrap each layer's attention and MLP in f ... g, and the LM head's input in f.

    Hooks (rather than wrapper modules) keep the HF module names, so ``local_state`` names match
    the checkpoint and the ShardMap."""
    if axis.group is None:
        return

    def pre(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return (copy_to_tp(args[0], axis),) + tuple(args[1:]), kwargs

    def post(_mod: nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(out, axis)

    def pre_experts(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        x, weights, idx = args  # the routing weights' gradient is summed over the experts' ranks too
        return (*copy_many_to_tp(axis, x, weights), idx), kwargs

    for layer in layers:
        # A MoE block's router stays outside f ... g: it runs on the replicated input on every tp
        # rank, so its gradient is complete without a reduction; only the experts are wrapped.
        ffn = layer.ffn.experts if layer.moe else layer.ffn
        for mod, before in ((layer.self_attn, pre), (ffn, pre_experts if layer.moe else pre)):
            mod.register_forward_pre_hook(before, with_kwargs=True)
            mod.register_forward_hook(post)
    if head is not None:
        head.register_forward_pre_hook(pre, with_kwargs=True)
