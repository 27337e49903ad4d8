"""Losses as pure tensor functions.

Every loss is a *sum* over the rows it is given divided by ``denom``, the token (or sequence)
count of the WHOLE mini-batch, passed in by the caller. A loss is therefore additive over
micro-batches and data-parallel ranks: any regrouping a plan chooses changes only the floating-
point summation order, never the result (DESIGN.md, "same results under every plan").

Shapes: B sequences, N response tokens, V vocabulary; ``mask`` [B, N] is 1 on real response
tokens (prompt and padding excluded).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V] predicting ids [B, T] -> log p(ids) [B, T] in float32."""
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).squeeze(-1)


def response_logits(logits: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Full-sequence logits [B, P + N, V] -> the logits that predict the N response tokens."""
    return logits[:, prompt_len - 1:-1]


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits): [B, N, V] -> [B, N]."""
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)


def masked_sum_over(x: torch.Tensor, mask: torch.Tensor, denom: float) -> torch.Tensor:
    """sum(x * mask) / denom: the mini-batch-normalised aggregate every token loss uses."""
    return (x * mask).sum() / denom


def policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                clip: float, denom: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017), per token:
        L_t = -min(r_t A_t, clip(r_t, 1 - clip, 1 + clip) A_t),  r_t = exp(logp_t - logp_old_t).
    All [B, N]. Returns (loss, sums for stats: clipped tokens, approx KL to the old policy)."""
    ratio = torch.exp(logp - logp_old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
    loss = masked_sum_over(-torch.minimum(unclipped, clipped), mask, denom)
    with torch.no_grad():
        stats = {"clipfrac": masked_sum_over((clipped < unclipped).float(), mask, denom),
                 "approx_kl": masked_sum_over(0.5 * (logp - logp_old).pow(2), mask, denom)}
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
        stats = {"clipfrac": masked_sum_over((l2 > l1).float(), mask, denom)}
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
        stats = {"margin": margin.sum() / denom, "accuracy": (margin > 0).float().sum() / denom}
    return loss, stats


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, denom: float
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model loss (InstructGPT): -log sigmoid(r_c - r_r), summed over pairs [B], / denom."""
    diff = r_chosen - r_rejected
    loss = -F.logsigmoid(diff).sum() / denom
    with torch.no_grad():
        stats = {"accuracy": (diff > 0).float().sum() / denom}
    return loss, stats
