"""KL estimators between the policy and the reference, per token (Schulman, "Approximating KL
Divergence", 2020). With r = p_ref / p_policy evaluated at tokens sampled from the policy:

    k1  = log p - log p_ref               unbiased, high variance, can be negative  (verl "kl")
    abs = |log p - log p_ref|             biased, >= 0                             (verl "abs")
    k2  = (log p - log p_ref)^2 / 2       biased, low variance, >= 0               (verl "mse")
    k3  = (r - 1) - log r                 unbiased, low variance, >= 0 (GRPO's)    (verl "low_var_kl")

k3 is computed as verl's ``low_var_kl``: log r clamped to [-20, 20] before exp, the estimate
clamped to [-10, 10] (so one pathological token cannot make the loss inf; beyond 10 the token
passes no gradient).
"""

from __future__ import annotations

import torch

from ..errors import UserError

ESTIMATORS = ("k1", "k2", "k3", "abs")
K3_LOG_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str) -> torch.Tensor:
    """logp, logp_ref [B, N] log-probs of the sampled tokens -> per-token KL estimate [B, N].

    Padding positions are not masked here: callers multiply by the response mask."""
    log_ratio = logp - logp_ref
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio.pow(2)
    if kind == "k3":
        log_r = (-log_ratio).clamp(-K3_LOG_CLAMP, K3_LOG_CLAMP)  # log r = log p_ref - log p
        return (torch.expm1(log_r) - log_r).clamp(-K3_CLAMP, K3_CLAMP)
    raise UserError(f"unknown KL estimator {kind!r}; choose one of {', '.join(ESTIMATORS)}")
