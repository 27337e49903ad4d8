"""Rollout/training mismatch: the engine's sampling log-probs against the trainer's, measured for
every backend and corrected where asked (docs/algorithms.md "Rollout correction").

The trainer recomputes log pi_trainer(y_t) of every response token with the actor as it stands
before the iteration's first update (its train layout, no grad). Against the engine's
log pi_engine(y_t) (``logp_old`` as generated):

    rollout/logp_diff_mean   mean over response tokens of |log pi_engine - log pi_trainer|
    rollout/logp_diff_max    the largest such difference in the batch
    rollout/mismatch_kl      token mean of k3 = (r - 1) - log r, r = pi_trainer / pi_engine
                             (an estimate of KL(pi_engine || pi_trainer) from the engine's samples)

meshrl's own engine computes the same network as the trainer, so these are ~0 (float rounding).
With another engine (gen.backend=vllm) the trainer's values become PPO's old log-probs (as verl
recomputes them) and ``ppo.rollout_is`` weights each token's policy loss by a truncated importance
ratio pi_trainer / pi_engine (token: per token; sequence: the product over the response), capped at
``ppo.rollout_is_cap``; ``ppo.rollout_mask_above`` gives weight 0 to sequences whose mean k3
exceeds it. The weights are constants (no gradient) and the loss keeps its normaliser.

Decoupled PPO (``ppo.decoupled``, AReaL's decoupled loss for stale samples) is the same correction
read the other way: the trainer's log-probs are those of the *proximal* policy pi_prox (the actor
before the iteration's first update), the engine's those of the *behaviour* policy pi_behav that
sampled the tokens (k versions old under ``train.off_policy=k``, or another engine):

    L_t = min(pi_prox / pi_behav, cap) * max(-A_t r_t, -A_t clip(r_t, 1 - eps, 1 + eps)),  r_t = pi_theta / pi_prox

so the clip bounds each update's step from pi_prox, and the truncated weight corrects for sampling
from pi_behav (per token; ``ppo.rollout_is=sequence`` makes it the sequence's product).
"""

from __future__ import annotations

import math

import torch

from ..model.numerics import wide
from .batch import Batch
from .handles import ModelHandle
from .kl import kl_estimate


def trainer_logprobs(h: ModelHandle, data: Batch, dp_index: int, dp_size: int, micro_batches: int,
                     sum_replicas) -> torch.Tensor | None:
    """log pi_trainer of every response token of ``data`` [B, N] (0 on padding), on the ranks that
    hold outputs (None elsewhere): each replica computes its split, the replicas' rows are summed
    into place (each row is non-zero on one replica only, so the float64 sum is exact)."""
    part = data.split(dp_size)[dp_index] if dp_size > 1 else data
    lp = h.logprobs(part["input_ids"], part["attention_mask"], max(1, min(micro_batches, len(part))))
    if lp is None:
        return None
    n = data["response_mask"].shape[1]
    mine = wide(lp[:, -n:]) * part["response_mask"]
    if dp_size == 1 or sum_replicas is None:
        return mine
    full = torch.zeros(len(data), n, dtype=torch.float64)
    full[part.index] = mine.double()
    summed = torch.tensor(sum_replicas(full.flatten().tolist()), dtype=torch.float64)
    return summed.view(len(data), n).to(mine.dtype)


def mismatch_sums(logp_engine: torch.Tensor, logp_trainer: torch.Tensor, mask: torch.Tensor
                  ) -> tuple[float, float, float, float]:
    """(sum of |diff|, sum of k3, tokens, max |diff|) over the response tokens of [B, N] log-probs."""
    m = mask.float()
    diff = (logp_engine - logp_trainer).abs() * m
    k3 = kl_estimate(logp_engine, logp_trainer, "k3") * m
    return float(diff.sum()), float(k3.sum()), float(m.sum()), float(diff.max()) if diff.numel() else 0.0


def mismatch_figures(diff: float, k3: float, tokens: float, most: float) -> dict[str, float]:
    """The rollout/* figures of ``mismatch_sums``' four numbers."""
    tokens = max(tokens, 1.0)
    return {"rollout/logp_diff_mean": diff / tokens, "rollout/logp_diff_max": most, "rollout/mismatch_kl": k3 / tokens}


def mismatch_metrics(logp_engine: torch.Tensor, logp_trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """rollout/logp_diff_mean, rollout/logp_diff_max, rollout/mismatch_kl of [B, N] log-probs."""
    return mismatch_figures(*mismatch_sums(logp_engine, logp_trainer, mask))


def rollout_weights(logp_engine: torch.Tensor, logp_trainer: torch.Tensor, mask: torch.Tensor, mode: str,
                    cap: float, mask_above: float | None) -> torch.Tensor:
    """Per-token loss weights [B, N] (1 where nothing applies):

        token:     w_t = min(pi_trainer(y_t) / pi_engine(y_t), cap)
        sequence:  w_t = min(prod_s pi_trainer(y_s) / pi_engine(y_s), cap)   for every t of the row
        mask:      w_t = 0 for every t of a row whose mean k3 over its tokens > mask_above

    computed in log space and capped before exponentiating (no overflow)."""
    m = mask.float()
    log_r = (logp_trainer - logp_engine) * m
    lcap = math.log(cap)
    if mode == "token":
        w = torch.exp(log_r.clamp(max=lcap))
    elif mode == "sequence":
        w = torch.exp(log_r.sum(-1, keepdim=True).clamp(max=lcap)).expand_as(m)
    else:
        w = torch.ones_like(m)
    if mask_above is not None:
        seq_k3 = (kl_estimate(logp_engine, logp_trainer, "k3") * m).sum(-1) / m.sum(-1).clamp(min=1)
        w = w * (seq_k3 <= mask_above).float()[:, None]
    return w * m


def rollout_correction(h: ModelHandle, data: Batch, cfg, dp_index: int, dp_size: int, micro_batches: int,
                       sum_replicas) -> tuple[Batch, dict[str, float]]:
    """``data`` with the trainer's old log-probs (engines other than meshrl's) and the loss weights
    ``is_weight`` (ppo.rollout_is / rollout_mask_above) on the ranks that hold outputs, and the
    rollout/* figures there ({} and ``data`` unchanged elsewhere)."""
    trainer = trainer_logprobs(h, data, dp_index, dp_size, micro_batches, sum_replicas)
    if trainer is None:
        return data, {}
    engine, mask = data["logp_old"], data["response_mask"]
    stats = mismatch_metrics(engine, trainer, mask)
    p = cfg.ppo
    if cfg.gen.backend != "meshrl" or p.decoupled:  # only meshrl's engine promises the trainer's own numbers;
        data = data.with_(logp_old=trainer)  # decoupled PPO clips around the proximal policy, the trainer's
    mode = "token" if p.decoupled and p.rollout_is == "off" else p.rollout_is  # decoupled: pi_prox / pi_behav
    if mode != "off" or p.rollout_mask_above is not None:
        w = rollout_weights(engine, trainer, mask, mode, p.rollout_is_cap, p.rollout_mask_above)
        tokens = float(mask.sum().clamp(min=1))
        stats["rollout/is_weight_mean"] = float(w.sum()) / tokens
        rows = mask.sum(-1) > 0
        dropped = rows & (w.sum(-1) == 0)
        stats["rollout/masked_frac"] = float(dropped.sum()) / max(1, int(rows.sum()))
        data = data.with_(is_weight=w)
    return data, stats


class TrainForwardMismatch:
    """The rollout/* figures from the first mini-batch's training forward, where nothing needs the
    recompute's values (``Config.trainer_logprobs_needed`` false: meshrl's engine, no correction).
    That forward runs the actor as it stands before the iteration's first update, the network the
    recompute would run, so its log-probs are the trainer's for the first mini-batch's rows: the
    figures come at no extra forward, over those rows instead of the whole batch."""

    def __init__(self) -> None:
        self.diff, self.k3, self.tokens, self.max = 0.0, 0.0, 0.0, 0.0

    @torch.no_grad()
    def add(self, logp_trainer: torch.Tensor, logp_engine: torch.Tensor, mask: torch.Tensor) -> None:
        diff, k3, tokens, most = mismatch_sums(logp_engine, logp_trainer.detach().to(logp_engine.dtype), mask)
        self.diff, self.k3, self.tokens = self.diff + diff, self.k3 + k3, self.tokens + tokens
        self.max = max(self.max, most)

    def metrics(self, dp_index: int, dp_size: int, sum_replicas) -> dict[str, float]:
        """Summed over the data-parallel replicas; the max as the sum of a vector holding each
        replica's at its own index (exact)."""
        sums = [self.diff, self.k3, self.tokens] + [self.max if i == dp_index else 0.0 for i in range(dp_size)]
        if dp_size > 1 and sum_replicas is not None:
            sums = sum_replicas(sums)
        return mismatch_figures(sums[0], sums[1], sums[2], max(sums[3:]))
