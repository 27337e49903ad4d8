"""Rewards to advantages, as pure tensor functions over the response tokens.

Shapes: B sequences, N response tokens; ``mask`` [B, N] is 1 on real response tokens and 0 on
padding after the end (prompt tokens are never in these tensors, see batch.py). Sequence-level
scores are [B]. For the group methods (GRPO, RLOO) rows are prompt-major: the n samples of
prompt i are rows i*n .. i*n + n - 1.
"""

from __future__ import annotations

import torch

from ..model.numerics import wide, wide_dtype


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (a 0-dim tensor)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
                  ) -> torch.Tensor:
    """(x - mean) / std over the masked positions (unbiased variance); padding stays 0."""
    mean = masked_mean(x, mask)
    n = mask.sum().clamp(min=2)
    var = ((x - mean).pow(2) * mask).sum() / (n - 1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def normalize_scores(scores: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Reward normalisation over the batch: scores [B] -> (scores - mean) / std."""
    return (scores - scores.mean()) / (scores.std(unbiased=True) + eps) if scores.numel() > 1 \
        else scores - scores.mean()


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, N] -> long [B]: index of the last 1 (0 for an empty row). The mask need not be
    contiguous: a multi-turn row has observation tokens (0) between its policy turns."""
    pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), pos, torch.zeros_like(pos)).max(-1).values


def token_rewards(scores: torch.Tensor, kl: torch.Tensor | None, mask: torch.Tensor, kl_coef: float
                  ) -> torch.Tensor:
    """InstructGPT's per-token reward [B, N]: -kl_coef * kl_t on every response token, plus the
    sequence score on the last real token. ``kl`` None means no KL in the reward."""
    r = torch.zeros(mask.shape, dtype=wide_dtype(kl.dtype if kl is not None else scores.dtype))
    if kl is not None and kl_coef != 0.0:
        r = r - kl_coef * wide(kl)
    r = r.scatter_add(1, last_token_index(mask)[:, None], scores.to(r.dtype)[:, None])
    return r * mask


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over right-padded responses.

    rewards, values, mask [B, N]. Steps are the masked tokens only: t' is the next token with
    m = 1 after t (a multi-turn row skips the observation tokens between its turns), and the value
    after the last one is 0 (the episode ends):
        delta_t = r_t + gamma * V_{t'} - V_t
        A_t     = delta_t + gamma * lam * A_{t'}
    For a right-padded row (one turn) t' = t + 1. Returns (advantages, returns = advantages +
    values), both [B, N] and 0 where the mask is 0."""
    b, n = rewards.shape
    dt = torch.promote_types(wide_dtype(values.dtype), wide_dtype(rewards.dtype))  # float64 stays
    mask = mask.to(dt)
    adv = torch.zeros(b, n, dtype=dt)
    next_adv = torch.zeros(b, dtype=dt)
    next_value = torch.zeros(b, dtype=dt)
    for t in reversed(range(n)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = a * mask[:, t]
        live = mask[:, t] > 0
        next_adv = torch.where(live, a, next_adv)
        next_value = torch.where(live, values[:, t].to(dt), next_value)
    return adv, (adv + values.to(dt)) * mask


def group_advantages(scores: torch.Tensor, n: int, std_normalize: bool = True, eps: float = 1e-6
                     ) -> torch.Tensor:
    """GRPO (Shao et al. 2024, outcome supervision): scores [B] with B = prompts * n ->
    (s - mean_group) / (std_group + eps), unbiased std as in the reference implementations."""
    g = wide(scores).view(-1, n)
    centred = g - g.mean(-1, keepdim=True)
    if std_normalize:
        centred = centred / (g.std(-1, unbiased=True, keepdim=True) + eps)
    return centred.view(-1)


def rloo_advantages(scores: torch.Tensor, n: int) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): each sample's baseline is the mean of the other n - 1 samples
    of its prompt: A_i = s_i - (sum_j s_j - s_i) / (n - 1). scores [B] -> [B]."""
    g = wide(scores).view(-1, n)
    others = (g.sum(-1, keepdim=True) - g) / (n - 1)
    return (g - others).view(-1)


def remax_advantages(scores: torch.Tensor, greedy_scores: torch.Tensor) -> torch.Tensor:
    """ReMax (Li et al. 2023): the baseline is the reward of the greedy response to the same
    prompt. scores [B] (sampled), greedy_scores [B] (row i = greedy response of row i's prompt)."""
    return wide(scores) - wide(greedy_scores)


def broadcast_to_tokens(seq_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A sequence-level advantage [B] on every real response token -> [B, N]."""
    return wide(seq_adv)[:, None] * mask.to(wide_dtype(seq_adv.dtype))
