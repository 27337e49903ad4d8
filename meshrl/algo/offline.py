"""Train calls on fixed data: SFT, Bradley-Terry reward model, DPO (and DPO's reference call).

Data contracts (one optimizer step per call on the batch it is given):
    sft_train      input_ids, attention_mask [B, P+N], response_mask [B, N]        -> stats
    rm_train       chosen_* and rejected_* versions of those three keys              -> stats
    ref_pairs      chosen_*, rejected_*  -> ref_chosen, ref_rejected [B] (summed response log-probs)
    dpo_train      chosen_*, rejected_*, ref_chosen, ref_rejected                   -> stats
"""

from __future__ import annotations

import torch

from .batch import Batch
from .common import CallContext, Role, StatSum, optimizer_step
from .losses import bradley_terry_loss, dpo_loss, sft_loss
from .rollout import response_logprobs, sequence_reward

SEQ_KEYS = ("input_ids", "attention_mask", "response_mask")


def side(batch: Batch, prefix: str) -> Batch:
    """The chosen_ or rejected_ half of a pair batch, under the plain sequence key names."""
    return Batch({k: batch[prefix + k] for k in SEQ_KEYS})


def sft_train_call(role: Role, batch: Batch, ctx: CallContext) -> tuple[Batch, dict[str, float]]:
    """Token-level NLL of the responses, normalised by the batch's response tokens."""
    denom = float(batch["response_mask"].sum().clamp(min=1))
    stats = StatSum()
    role.model.train()
    for micro in batch.chunks(min(ctx.cfg.ppo.micro_batches, len(batch))):
        loss = sft_loss(response_logprobs(role.model, micro), micro["response_mask"].float(), denom)
        loss.backward()
        stats.add("loss", loss.detach())
    stats.add("grad_norm", optimizer_step(role, ctx.cfg.optim.grad_clip))
    return Batch(), {f"sft/{k}": v for k, v in stats.sums.items()}


def rm_train_call(role: Role, batch: Batch, ctx: CallContext) -> tuple[Batch, dict[str, float]]:
    """Bradley-Terry: -log sigmoid(r(chosen) - r(rejected)), normalised by the number of pairs."""
    denom = float(len(batch))
    stats = StatSum()
    role.model.train()
    for micro in batch.chunks(min(ctx.cfg.ppo.micro_batches, len(batch))):
        loss, st = bradley_terry_loss(sequence_reward(role.model, side(micro, "chosen_")),
                                      sequence_reward(role.model, side(micro, "rejected_")), denom)
        loss.backward()
        stats.add("loss", loss.detach())
        stats.add("accuracy", st["accuracy"])
    stats.add("grad_norm", optimizer_step(role, ctx.cfg.optim.grad_clip))
    return Batch(), {f"rm/{k}": v for k, v in stats.sums.items()}


@torch.no_grad()
def ref_pairs_call(role: Role, batch: Batch, ctx: CallContext) -> Batch:
    role.model.eval()
    return Batch({"ref_chosen": response_logprobs(role.model, side(batch, "chosen_")).sum(-1),
                  "ref_rejected": response_logprobs(role.model, side(batch, "rejected_")).sum(-1)})


def dpo_train_call(role: Role, batch: Batch, ctx: CallContext) -> tuple[Batch, dict[str, float]]:
    """DPO on summed response log-probs, normalised by the number of pairs."""
    denom = float(len(batch))
    stats = StatSum()
    role.model.train()
    for micro in batch.chunks(min(ctx.cfg.ppo.micro_batches, len(batch))):
        loss, st = dpo_loss(response_logprobs(role.model, side(micro, "chosen_")).sum(-1),
                            response_logprobs(role.model, side(micro, "rejected_")).sum(-1),
                            micro["ref_chosen"], micro["ref_rejected"], ctx.cfg.dpo.beta, denom)
        loss.backward()
        stats.add("loss", loss.detach())
        for k, v in st.items():
            stats.add(k, v)
    stats.add("grad_norm", optimizer_step(role, ctx.cfg.optim.grad_clip))
    return Batch(), {f"dpo/{k}": v for k, v in stats.sums.items()}
