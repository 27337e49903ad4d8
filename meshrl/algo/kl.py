"""KL estimators between the policy and the reference, per token (Schulman, "Approximating KL
Divergence", 2020). With r = p_ref / p_policy evaluated at tokens sampled from the policy:

    k1 = log p - log p_ref               unbiased, high variance, can be negative
    k2 = (log p - log p_ref)^2 / 2       biased, low variance, >= 0
    k3 = (r - 1) - log r                 unbiased, low variance, >= 0 (GRPO's choice)
"""

from __future__ import annotations

import torch

from ..errors import UserError

ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str) -> torch.Tensor:
    """logp, logp_ref [B, N] log-probs of the sampled tokens -> per-token KL estimate [B, N].

    Padding positions are not masked here: callers multiply by the response mask."""
    log_ratio = logp - logp_ref
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.pow(2)
    if kind == "k3":
        # clamp the exponent so a pathological token cannot make the loss inf (r = exp(-log_ratio))
        neg = (-log_ratio).clamp(max=20.0)
        return torch.expm1(neg) - neg
    raise UserError(f"unknown KL estimator {kind!r}; choose one of {', '.join(ESTIMATORS)}")
