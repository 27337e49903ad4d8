"""What each iteration of an algorithm trains on, and what it reports besides its calls' stats.

Pure functions of (config, iteration): the dataset a run draws from, the batch iteration t starts
from (keyed by seed and iteration only, so every rank and every plan picks the same rows), the
rollout metrics, and the figures of the run's one console line.
"""

from __future__ import annotations

import torch

from ..config import Config
from . import setup
from .batch import Batch
from .common import key_seed, keyed_generator
from .filtering import prompts_per_iteration
from .kl import kl_estimate
from .multiturn import env_metrics
from .user_rewards import part_names

RL_ALGOS = ("ppo", "grpo", "remax", "rloo")
CONSOLE_KEYS = {
    "rl": ("reward/mean", "kl/k1", "actor/pg_loss", "critic/vf_loss", "response/length", "eval/accuracy"),
    "sft": ("sft/loss", "reward/mean"), "dpo": ("dpo/loss", "dpo/accuracy", "reward/mean"),
    "rm": ("rm/loss", "rm/accuracy", "rm/heldout_accuracy"),
}


def console_keys(algo: str) -> tuple[str, ...]:
    """The figures of a run's one console line per iteration."""
    return CONSOLE_KEYS["rl" if algo in RL_ALGOS else algo]


def choose_rows(n_data: int, n: int, *key: object) -> torch.Tensor:
    """``n`` dataset rows for one iteration, keyed by (seed, iteration): without repeats if possible."""
    g = keyed_generator(*key)
    return torch.randperm(n_data, generator=g)[:n] if n <= n_data else torch.randint(n_data, (n,), generator=g)


def rollout_batch(prompts: Batch, cfg: Config, iteration: int) -> Batch:
    """The iteration's prompts, each repeated samples_per_prompt times (prompt-major), with the
    sampling seed of every (prompt, sample): same tokens whatever the split or batch order."""
    b, n, seed = prompts_per_iteration(cfg), cfg.data.samples_per_prompt, cfg.train.seed
    rows = choose_rows(len(prompts), b, seed, "prompts", iteration).repeat_interleave(n)
    sample = torch.arange(n).repeat(b)
    seeds = torch.tensor([key_seed(seed, iteration, int(p), int(s)) for p, s in zip(rows, sample, strict=True)])
    return Batch(prompts.select(rows).data).with_(sample_seed=seeds)


def rollout_metrics(batch: Batch, cfg: Config | None = None) -> dict[str, float]:
    """Figures of the iteration's generated batch (all of it, also under data.filter_groups): reward
    mean/std, each reward source as reward/NAME (reward.fn, overlong), response length, KL."""
    mask = batch["response_mask"].float()
    out = {"reward/mean": float(batch["scores"].mean()), "reward/std": float(batch["scores"].std()),
           "response/length": float(mask.sum(-1).mean()), "response/length_max": float(mask.sum(-1).max())}
    if cfg is not None and "score_parts" in batch:
        for name, col in zip(part_names(cfg), batch["score_parts"].float().unbind(1), strict=True):
            out[f"reward/{name}"] = float(col.mean())
    if "logp_ref" in batch:
        out["kl/k1"] = float((kl_estimate(batch["logp_old"], batch["logp_ref"], "k1") * mask).sum(-1).mean())
        out["kl/k3"] = float((kl_estimate(batch["logp_old"], batch["logp_ref"], "k3") * mask).sum(-1).mean())
    if "scores_greedy" in batch:
        out["reward/greedy_mean"] = float(batch["scores_greedy"].mean())
    if "env_counts" in batch:
        out.update(env_metrics(batch))
    return out


def offline_batch(data: Batch, cfg: Config, iteration: int) -> Batch:
    rows = choose_rows(len(data), cfg.data.batch_size, cfg.train.seed, "batch", iteration)
    return Batch(data.select(rows).data)


def dataset(cfg: Config, tok) -> Batch:
    """What the iterations draw from: the prompts (RL), SFT sequences (sft) or preference pairs
    (rm, dpo)."""
    if cfg.algo == "sft":
        return setup.encode_sft_batch(cfg, tok, setup.sft_records(cfg))
    if cfg.algo in ("rm", "dpo"):
        return setup.encode_pair_batch(cfg, tok, setup.pair_records(cfg))
    return setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg))


def iteration_batch(data: Batch, cfg: Config, iteration: int) -> Batch:
    """The batch iteration ``iteration`` starts from, keyed by (seed, iteration) only."""
    return rollout_batch(data, cfg, iteration) if cfg.algo in RL_ALGOS else offline_batch(data, cfg, iteration)
