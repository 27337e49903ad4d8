"""The calls of the algorithms on fixed data (SFT, Bradley-Terry reward model, DPO) on a model
handle, as meshrl/algo/calls.py has the RL ones: the same code runs on one process
(LocalHandle) and on any layout (ParallelModel).

Data contracts (P = prompt_len, N = gen_len; each train call takes one optimizer step):

    sft   actor_train    input_ids, attention_mask [B, P+N], response_mask [B, N]  -> sft/* stats
    rm    reward_train   chosen_* and rejected_* versions of those three keys      -> rm/* stats
    dpo   ref_inf        chosen_*, rejected_* -> ref_chosen, ref_rejected [B] (summed response
                         log-probs; row-wise, like the RL inference calls)
          actor_train    chosen_*, rejected_*, ref_chosen, ref_rejected            -> dpo/* stats

A train call gives each data-parallel replica its part of the batch (``Batch.split``) and divides
every loss by the whole batch's count (response tokens for SFT, pairs for RM and DPO), so the split
and the micro-batches change only the summation order. The pair losses are not additive over a
pair's two sides, so both sides run as rows of one forward: each micro-batch is its pairs' chosen
rows followed by their rejected rows (``pair_rows``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..model.heads import HeadOutputs
from .advantages import last_token_index
from .batch import Batch
from .calls import Place, reduce_stats, scheduled_step
from .common import CallContext, StatSum
from .handles import ModelHandle
from .losses import bradley_terry_loss, dpo_loss, sft_loss
from .registry import SEQ_KEYS, side
from ..model.numerics import wide


def _replica_part(batch: Batch, place: Place) -> Batch:
    return batch.split(place.dp_size)[place.dp_index] if place.dp_size > 1 else batch


def _response_sums(logprobs: torch.Tensor, mb) -> torch.Tensor:
    """log-probs [b, S-1] -> summed log-prob of each row's response tokens [b]."""
    mask = mb["response_mask"]
    return (logprobs[:, mb["input_ids"].shape[1] - mask.shape[1] - 1:] * mask).sum(-1)


def _last_values(values: torch.Tensor, mb) -> torch.Tensor:
    """values [b, S] -> the value at each row's last real response token [b] float32 (float64 stays)."""
    last = mb["input_ids"].shape[1] - mb["response_mask"].shape[1] + last_token_index(mb["response_mask"])
    return wide(values).gather(1, last[:, None]).squeeze(1)


def pair_rows(part: Batch, micro_batches: int, extra: tuple[str, str] | None = None
              ) -> tuple[dict[str, torch.Tensor], int]:
    """b pairs -> 2b rows (SEQ_KEYS, plus ``extra``'s two per-side tensors under the key "ref") and
    m, the largest micro-batch count <= ``micro_batches`` that divides b: cut into m equal parts by
    rows, part i is pair block i's chosen rows then its rejected rows, so no pair is split."""
    b = len(part)
    m = max(d for d in range(1, min(micro_batches, b) + 1) if b % d == 0)
    k = b // m
    blocks = [torch.arange(i * k, (i + 1) * k) for i in range(m)]
    order = torch.cat([torch.cat([blk, blk + b]) for blk in blocks])
    rows = {key: torch.cat([part["chosen_" + key], part["rejected_" + key]])[order] for key in SEQ_KEYS}
    if extra is not None:
        rows["ref"] = torch.cat([part[extra[0]], part[extra[1]]])[order]
    return rows, m


def _finish(h: ModelHandle, stats: StatSum, place: Place, prefix: str, ctx: CallContext) -> dict[str, float]:
    """The call's one optimizer step at the scheduled LR, then the stats summed over the replicas
    and optim/lr (holders only)."""
    lr = scheduled_step(h, ctx, 0)
    stats.add("grad_norm", h.optimizer_step() / (place.dp_size if place.holds_output else 1))
    if not place.holds_output:
        return {}
    return {**{f"{prefix}/{k}": v for k, v in reduce_stats(stats, place).items()}, "optim/lr": lr}


def sft_train(h: ModelHandle, batch: Batch, ctx: CallContext, place: Place) -> dict[str, float]:
    """Token-level NLL of the responses over the batch's response tokens; -> sft/loss, sft/grad_norm."""
    denom = float(batch["response_mask"].sum().clamp(min=1))
    part = _replica_part(batch.only(list(SEQ_KEYS)), place)
    stats = StatSum()

    def loss_fn(out: HeadOutputs, mb) -> torch.Tensor:
        mask = mb["response_mask"].float()
        loss = sft_loss(out.logprobs[:, mb["input_ids"].shape[1] - mask.shape[1] - 1:], mask, denom)
        stats.add("loss", loss.detach())
        return loss

    h.forward_backward(dict(part.data), loss_fn, min(place.micro_batches, len(part)))
    return _finish(h, stats, place, "sft", ctx)


def rm_train(h: ModelHandle, batch: Batch, ctx: CallContext, place: Place) -> dict[str, float]:
    """Bradley-Terry: -log sigmoid(r(chosen) - r(rejected)) over the batch's pairs; -> rm/loss,
    rm/accuracy, rm/grad_norm, and reward/mean: the updated model's mean score of the chosen side."""
    denom = float(len(batch))
    part = _replica_part(batch, place)
    rows, micro = pair_rows(part, place.micro_batches)
    stats = StatSum()

    def loss_fn(out: HeadOutputs, mb) -> torch.Tensor:
        r = _last_values(out.values, mb)
        k = len(r) // 2
        loss, st = bradley_terry_loss(r[:k], r[k:], denom)
        stats.add("loss", loss.detach())
        stats.add("accuracy", st["accuracy"])
        return loss

    h.forward_backward(rows, loss_fn, micro)
    lr = scheduled_step(h, ctx, 0)
    stats.add("grad_norm", h.optimizer_step() / (place.dp_size if place.holds_output else 1))
    chosen = side(part, "chosen_").data
    scores = h.values(chosen["input_ids"], chosen["attention_mask"], min(place.micro_batches, len(part)))
    if not place.holds_output:
        return {}
    stats.add("chosen_score", _last_values(scores, chosen).sum() / denom)
    out = {f"rm/{k}": v for k, v in reduce_stats(stats, place).items()}
    out["reward/mean"] = out.pop("rm/chosen_score")
    out["optim/lr"] = lr
    return out


@torch.no_grad()
def ref_pair_rows(h: ModelHandle, part: Batch, ctx: CallContext, place: Place) -> Batch | None:
    """ref_chosen, ref_rejected [b]: the frozen reference's summed response log-probs of each side."""
    out = {}
    for prefix in ("chosen_", "rejected_"):  # both forwards on every rank: each is a collective
        s = side(part, prefix)
        out[prefix] = h.logprobs(s["input_ids"], s["attention_mask"], place.micro_batches)
    if out["chosen_"] is None:
        return None
    return Batch({"ref_chosen": _response_sums(out["chosen_"], side(part, "chosen_").data),
                  "ref_rejected": _response_sums(out["rejected_"], side(part, "rejected_").data)}, part.index)


def dpo_train(h: ModelHandle, batch: Batch, ctx: CallContext, place: Place) -> dict[str, float]:
    """DPO on summed response log-probs over the batch's pairs; -> dpo/loss, dpo/margin,
    dpo/accuracy, dpo/grad_norm."""
    denom, beta = float(len(batch)), ctx.cfg.dpo.beta
    rows, micro = pair_rows(_replica_part(batch, place), place.micro_batches, ("ref_chosen", "ref_rejected"))
    stats = StatSum()

    def loss_fn(out: HeadOutputs, mb) -> torch.Tensor:
        pi, ref = _response_sums(out.logprobs, mb), mb["ref"]
        k = len(pi) // 2
        loss, st = dpo_loss(pi[:k], pi[k:], ref[:k], ref[k:], beta, denom)
        stats.add("loss", loss.detach())
        for name, v in st.items():
            stats.add(name, v)
        return loss

    h.forward_backward(rows, loss_fn, micro)
    return _finish(h, stats, place, "dpo", ctx)


OFFLINE_CALLS: dict[str, dict[str, Callable]] = {
    "sft": {"actor_train": sft_train},
    "rm": {"reward_train": rm_train},
    "dpo": {"ref_inf": ref_pair_rows, "actor_train": dpo_train},
}
