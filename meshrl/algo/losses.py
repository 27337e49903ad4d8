"""Losses as pure tensor functions.

Every loss is a *sum* over the rows it is given divided by ``denom``, the token (or sequence)
count of the WHOLE mini-batch, passed in by the caller. A loss is therefore additive over
micro-batches and data-parallel ranks: any regrouping a plan chooses changes only the floating-
point summation order, never the result (DESIGN.md, "same results under every plan").

Shapes: B sequences, N response tokens, V vocabulary; ``mask`` [B, N] is 1 on real response
tokens (prompt and padding excluded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from ..model.numerics import wide


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V] predicting ids [B, T] -> log p(ids) [B, T] in float32 (float64 stays)."""
    return torch.log_softmax(wide(logits), -1).gather(-1, ids[..., None]).squeeze(-1)


def response_logits(logits: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Full-sequence logits [B, P + N, V] -> the logits that predict the N response tokens."""
    return logits[:, prompt_len - 1:-1]


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits): [B, N, V] -> [B, N]."""
    logp = torch.log_softmax(wide(logits), -1)
    return -(logp.exp() * logp).sum(-1)


def masked_sum_over(x: torch.Tensor, mask: torch.Tensor, denom: float) -> torch.Tensor:
    """sum(x * mask) / denom: the mini-batch-normalised aggregate every token loss uses."""
    return (x * mask).sum() / denom


LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
RATIOS = ("token", "sequence")
LOG_RATIO_CLAMP = 20.0  # verl clamps log(pi/pi_old) to +-20 before exp, so one token cannot give inf
SEQ_LOG_RATIO_MAX = 10.0  # GSPO's sequence log-ratio is capped at 10 (verl's compute_policy_loss_gspo)


@dataclass(frozen=True)
class Norm:
    """Counts of the WHOLE mini-batch an aggregate divides by: response tokens, sequences, and the
    run's fixed response width N (Dr. GRPO's constant normaliser)."""

    tokens: float
    seqs: float = 1.0
    width: float = 1.0


def aggregate(x: torch.Tensor, mask: torch.Tensor, norm: Norm | float, mode: str = "token-mean") -> torch.Tensor:
    """Per-token losses x [B, N] -> this micro-batch's share of the mini-batch loss (verl's agg_loss):

        token-mean               sum_{i,t} m x / tokens
        seq-mean-token-mean      sum_i (sum_t m x / |y_i|) / seqs
        seq-mean-token-sum       sum_{i,t} m x / seqs
        seq-mean-token-sum-norm  sum_{i,t} m x / (seqs * N)      (Dr. GRPO)

    Every mode is a sum over rows of a row-local term divided by a whole-mini-batch count, so the
    micro-batch / rank split changes only the summation order. ``norm`` a float = token count."""
    if not isinstance(norm, Norm):
        norm = Norm(tokens=float(norm))
    if mode == "token-mean":
        return (x * mask).sum() / norm.tokens
    if mode == "seq-mean-token-mean":
        return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / norm.seqs
    if mode == "seq-mean-token-sum":
        return (x * mask).sum() / norm.seqs
    if mode == "seq-mean-token-sum-norm":
        return (x * mask).sum() / (norm.seqs * norm.width)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(LOSS_AGGS)}")


def log_ratio(logp: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor, kind: str = "token") -> torch.Tensor:
    """log of the importance ratio [B, N].

    token:    clamp(logp_t - logp_old_t, -20, 20)
    sequence: GSPO (Zheng et al. 2025), log s_i = mean_t (logp_t - logp_old_t) over the response,
              written per token as logp_t - sg(logp_t) + sg(log s_i): the value is log s_i on every
              token, the gradient is that of logp_t (GSPO-token); capped at 10 as verl does."""
    if kind == "token":
        return (logp - logp_old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "sequence":
        seq = ((logp - logp_old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return (logp - logp.detach() + seq.detach()[:, None]).clamp(max=SEQ_LOG_RATIO_MAX)
    raise ValueError(f"unknown ratio {kind!r}; choose one of {', '.join(RATIOS)}")


def policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                clip: float, denom: Norm | float, clip_high: float | None = None, dual_clip: float = 0.0,
                ratio: str = "token", agg: str = "token-mean", weights: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017) with the variants verl offers, per token:

        r_t  = exp(log_ratio)                     (``ratio``: token, or GSPO's sequence ratio)
        L_t  = max(-A_t r_t, -A_t clip(r_t, 1 - clip, 1 + clip_high))   (DAPO's clip-higher)
        L_t  = min(L_t, c |A_t|)  where A_t < 0, if dual_clip = c > 1    (Ye et al. 2020, dual-clip)

    times ``weights`` [B, N] when given (rollout correction, meshrl/algo/mismatch.py: constants),
    aggregated by ``agg`` over the mask (see ``aggregate``). All [B, N]. Returns (loss, sums for
    stats, token-mean: clipped tokens, dual-clipped tokens, approx KL to the old policy)."""
    hi = clip if clip_high is None else clip_high
    lr = log_ratio(logp, logp_old, mask, ratio)
    r = torch.exp(lr)
    l1 = -adv * r
    l2 = -adv * r.clamp(1.0 - clip, 1.0 + hi)
    per_token = torch.maximum(l1, l2)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip > 0.0:
        cap = -adv * dual_clip  # = c |A| where A < 0
        dual = (adv < 0) & (per_token > cap)
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)
    if weights is not None:
        per_token = per_token * weights.detach()
    loss = aggregate(per_token, mask, denom, agg)
    tokens = denom.tokens if isinstance(denom, Norm) else float(denom)
    with torch.no_grad():
        stats = {"clipfrac": masked_sum_over((l2 > l1).to(l1.dtype), mask, tokens),
                 "approx_kl": masked_sum_over(0.5 * (logp - logp_old).pow(2), mask, tokens)}
        if dual_clip > 0.0:
            stats["dual_clipfrac"] = masked_sum_over(dual.to(l1.dtype), mask, tokens)
    return loss, stats


def value_loss(values: torch.Tensor, values_old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float, denom: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, per token:
        L_t = 0.5 * max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -clip, clip) - R_t)^2).
    All [B, N]. Returns (loss, {"clipfrac"})."""
    v_clipped = values_old + (values - values_old).clamp(-clip, clip)
    l1 = (values - returns).pow(2)
    l2 = (v_clipped - returns).pow(2)
    loss = masked_sum_over(0.5 * torch.maximum(l1, l2), mask, denom)
    with torch.no_grad():
        stats = {"clipfrac": masked_sum_over((l2 > l1).to(l1.dtype), mask, denom)}
    return loss, stats


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, denom: float) -> torch.Tensor:
    """Negative log-likelihood of the response tokens: -sum(logp * mask) / denom. [B, N] -> []."""
    return masked_sum_over(-logp, mask, denom)


def dpo_loss(pi_chosen: torch.Tensor, pi_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, denom: float
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO (Rafailov et al. 2023). Inputs are summed response log-probs per pair, each [B]:
        L = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), summed, / denom (pairs).
    Returns (loss, sums of the implicit reward margin and of correctly ordered pairs)."""
    margin = beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))
    loss = -F.logsigmoid(margin).sum() / denom
    with torch.no_grad():
        stats = {"margin": margin.sum() / denom, "accuracy": (margin > 0).to(margin.dtype).sum() / denom}
    return loss, stats


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, denom: float
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model loss (InstructGPT): -log sigmoid(r_c - r_r), summed over pairs [B], / denom."""
    diff = r_chosen - r_rejected
    loss = -F.logsigmoid(diff).sum() / denom
    with torch.no_grad():
        stats = {"accuracy": (diff > 0).to(diff.dtype).sum() / denom}
    return loss, stats
