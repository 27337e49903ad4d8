"""The RL train calls: advantages from the rollout, then clipped PPO updates of actor or critic.

Data contracts:
    actor_train   input_ids, attention_mask, response_mask, logp_old, logp_ref, scores,
                  (+ values for ppo, + scores_greedy for remax)            -> stats only
    critic_train  input_ids, attention_mask, response_mask, logp_old, logp_ref, scores, values
                                                                          -> stats only
Both compute the advantages themselves from the same inputs with the same pure function, so they
share nothing but the batch. Mini-batches are a permutation keyed by (seed, iteration, epoch);
each loss is divided by the token count of its whole mini-batch (see losses.py), so
``ppo.micro_batches`` and any DP split change only the order of summation.
"""

from __future__ import annotations

import torch

from ..config import Config
from .advantages import (broadcast_to_tokens, gae, group_advantages, masked_whiten, normalize_scores,
                         remax_advantages, rloo_advantages, token_rewards)
from .batch import Batch
from .common import CallContext, Role, StatSum, minibatch_rows, optimizer_step
from .kl import kl_estimate
from .losses import entropy, masked_sum_over, policy_loss, response_logits, token_logprobs, value_loss
from .rollout import response_values, trim


def kl_settings(cfg: Config, algo: str) -> tuple[str, str]:
    """(mode, estimator) after resolving 'auto': GRPO uses a k3 KL loss, the others k1 in the reward."""
    mode = cfg.ppo.kl_mode if cfg.ppo.kl_mode != "auto" else ("loss" if algo == "grpo" else "reward")
    est = cfg.ppo.kl_estimator if cfg.ppo.kl_estimator != "auto" else ("k3" if mode == "loss" else "k1")
    return mode, est


def ppo_advantages(batch: Batch, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the iteration's batch -> (advantages, returns), both [B, N]."""
    mask = batch["response_mask"].float()
    mode, est = kl_settings(cfg, "ppo")
    scores = batch["scores"].float()
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
    scores = batch["scores"].float()
    if mode == "reward":  # sequence-level KL penalty: sum of the per-token estimates
        scores = scores - cfg.ppo.kl_coef * (kl_estimate(batch["logp_old"], batch["logp_ref"], est) * mask).sum(-1)
    n = cfg.data.samples_per_prompt
    if algo == "grpo":
        seq = group_advantages(scores, n, cfg.ppo.grpo_std)
    elif algo == "rloo":
        seq = rloo_advantages(scores, n)
    elif algo == "remax":
        greedy = batch["scores_greedy"].float()
        if cfg.ppo.normalize_rewards:
            scores, greedy = _normalize_pair(scores, greedy)
        seq = remax_advantages(scores, greedy)
    else:
        raise ValueError(f"{algo} has a critic; use ppo_advantages")
    return broadcast_to_tokens(seq, mask)


def _normalize_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    both = normalize_scores(torch.cat([a, b]))
    return both[:len(a)], both[len(a):]


def actor_train_call(role: Role, batch: Batch, ctx: CallContext) -> tuple[Batch, dict[str, float]]:
    """PPO-clip updates of the actor over ppo.epochs x ppo.mini_batches optimizer steps."""
    cfg = ctx.cfg
    adv = ppo_advantages(batch, cfg)[0] if ctx.algo == "ppo" else critic_free_advantages(batch, cfg, ctx.algo)
    mode, est = kl_settings(cfg, ctx.algo)
    data = batch.with_(advantages=adv)
    stats = StatSum()
    role.model.train()
    for epoch in range(cfg.ppo.epochs):
        for rows in minibatch_rows(len(data), cfg.ppo.mini_batches, cfg.train.seed, ctx.iteration, epoch):
            mb = data.select(rows)
            denom = float(mb["response_mask"].sum().clamp(min=1))
            for micro in mb.chunks(min(cfg.ppo.micro_batches, len(mb))):
                loss = _actor_loss(role, micro, cfg, mode, est, denom, stats)
                loss.backward()
            stats.add("grad_norm", optimizer_step(role, cfg.optim.grad_clip))
    # Micro-batch terms add up to their mini-batch's value: report the mean per optimizer step.
    steps = cfg.ppo.epochs * min(cfg.ppo.mini_batches, len(data))
    return Batch(), {f"actor/{k}": v / steps for k, v in stats.sums.items()}


def _actor_loss(role: Role, mb: Batch, cfg: Config, mode: str, est: str, denom: float, stats: StatSum
                ) -> torch.Tensor:
    """One micro-batch's share of the actor loss (already divided by the mini-batch's tokens)."""
    mask = mb["response_mask"].float()
    ids, attn, p, n = trim(mb)
    logits = response_logits(role.model(ids, attn), p)  # [B, n', V], n' <= N trailing pads dropped
    mask, logp_old, adv = mask[:, :n], mb["logp_old"][:, :n], mb["advantages"][:, :n]
    logp = token_logprobs(logits, ids[:, p:])
    loss, st = policy_loss(logp, logp_old, adv, mask, cfg.ppo.clip, denom)
    stats.add("pg_loss", loss.detach())
    for k, v in st.items():
        stats.add(k, v)
    if mode == "loss" and cfg.ppo.kl_coef != 0.0:
        kl = masked_sum_over(kl_estimate(logp, mb["logp_ref"][:, :n], est), mask, denom)
        stats.add("kl_loss", kl.detach())
        loss = loss + cfg.ppo.kl_coef * kl
    if cfg.ppo.entropy_coef != 0.0:
        ent = masked_sum_over(entropy(logits), mask, denom)
        stats.add("entropy", ent.detach())
        loss = loss - cfg.ppo.entropy_coef * ent
    return loss


def critic_train_call(role: Role, batch: Batch, ctx: CallContext) -> tuple[Batch, dict[str, float]]:
    """Clipped value regression on the GAE returns, same mini-batching as the actor."""
    cfg = ctx.cfg
    _, returns = ppo_advantages(batch, cfg)
    data = batch.with_(returns=returns)
    stats = StatSum()
    role.model.train()
    for epoch in range(cfg.ppo.epochs):
        for rows in minibatch_rows(len(data), cfg.ppo.mini_batches, cfg.train.seed, ctx.iteration, epoch):
            mb = data.select(rows)
            denom = float(mb["response_mask"].sum().clamp(min=1))
            for micro in mb.chunks(min(cfg.ppo.micro_batches, len(mb))):
                v = response_values(role.model, micro)
                loss, st = value_loss(v, micro["values"], micro["returns"], micro["response_mask"].float(),
                                      cfg.ppo.value_clip, denom)
                loss.backward()
                stats.add("vf_loss", loss.detach())
                stats.add("vf_clipfrac", st["clipfrac"])
            stats.add("grad_norm", optimizer_step(role, cfg.optim.grad_clip))
    steps = cfg.ppo.epochs * min(cfg.ppo.mini_batches, len(data))
    return Batch(), {f"critic/{k}": v / steps for k, v in stats.sums.items()}
