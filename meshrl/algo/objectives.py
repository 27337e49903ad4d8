"""What the RL train calls optimise, as pure functions of the rollout batch: the KL settings, and
the advantages (and PPO's returns) that meshrl/algo/calls.py's actor_train and critic_train
compute from the same inputs. Both train calls derive them themselves, so they share nothing but
the batch.
"""

from __future__ import annotations

import torch

from ..config import Config
from .advantages import (broadcast_to_tokens, gae, group_advantages, masked_whiten, normalize_scores,
                         remax_advantages, rloo_advantages, token_rewards)
from .batch import Batch
from .kl import kl_estimate
from ..model.numerics import wide


def kl_settings(cfg: Config, algo: str) -> tuple[str, str]:
    """(mode, estimator) after resolving 'auto': GRPO uses a k3 KL loss, the others k1 in the reward."""
    mode = cfg.ppo.kl_mode if cfg.ppo.kl_mode != "auto" else ("loss" if algo == "grpo" else "reward")
    est = cfg.ppo.kl_estimator if cfg.ppo.kl_estimator != "auto" else ("k3" if mode == "loss" else "k1")
    return mode, est


def ppo_advantages(batch: Batch, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the iteration's batch -> (advantages, returns), both [B, N]."""
    mask = batch["response_mask"].float()
    mode, est = kl_settings(cfg, "ppo")
    scores = wide(batch["scores"])
    if cfg.ppo.normalize_rewards:
        scores = normalize_scores(scores)
    kl = kl_estimate(batch["logp_old"], batch["logp_ref"], est) * mask if mode == "reward" else None
    rewards = token_rewards(scores, kl, mask, cfg.ppo.kl_coef)
    adv, returns = gae(rewards, batch["values"], mask, cfg.ppo.gamma, cfg.ppo.lam)
    if cfg.ppo.whiten_advantages:
        adv = masked_whiten(adv, mask)
    return adv, returns


def critic_free_advantages(batch: Batch, cfg: Config, algo: str) -> torch.Tensor:
    """GRPO / RLOO / ReMax: one advantage per sequence, on each of its response tokens, [B, N]."""
    mask = batch["response_mask"].float()
    mode, est = kl_settings(cfg, algo)
    scores = wide(batch["scores"])
    if mode == "reward":  # sequence-level KL penalty: sum of the per-token estimates
        scores = scores - cfg.ppo.kl_coef * (kl_estimate(batch["logp_old"], batch["logp_ref"], est) * mask).sum(-1)
    n = cfg.data.samples_per_prompt
    if algo == "grpo":
        seq = group_advantages(scores, n, cfg.ppo.grpo_std)
    elif algo == "rloo":
        seq = rloo_advantages(scores, n)
    elif algo == "remax":
        greedy = wide(batch["scores_greedy"])
        if cfg.ppo.normalize_rewards:
            scores, greedy = _normalize_pair(scores, greedy)
        seq = remax_advantages(scores, greedy)
    else:
        raise ValueError(f"{algo} has a critic; use ppo_advantages")
    return broadcast_to_tokens(seq, mask)


def _normalize_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    both = normalize_scores(torch.cat([a, b]))
    return both[:len(a)], both[len(a):]
