"""Validation of the recipe keys (ppo.loss_agg / clip_high / dual_clip / ratio, optim.schedule,
reward.fn, env.*, data.chat_template / filter_groups, eval.*): one UserError naming the key, raised when
the config is loaded, so nothing bad reaches a rank."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from .losses import LOSS_AGGS, RATIOS
from .lr_schedule import SCHEDULES
from .env import validate_env
from .user_rewards import validate_reward
import math
from ..data.chat import load_chat_template


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r} is not one of {', '.join(allowed)}")


def validate_recipes(cfg) -> None:
    p, o = cfg.ppo, cfg.optim

    for key, v in (("ppo.clip_high", p.clip_high), ("ppo.dual_clip", p.dual_clip),
                   ("optim.min_lr_ratio", o.min_lr_ratio),
                   ("reward.overlong_penalty", cfg.reward.overlong_penalty), ("eval.correct", cfg.eval.correct)):
        if v is not None and not math.isfinite(v):
            raise UserError(f"{key} must be a finite number, got {v}")
    _one_of("ppo.loss_agg", p.loss_agg, LOSS_AGGS)
    _one_of("ppo.ratio", p.ratio, RATIOS)
    _one_of("optim.schedule", o.schedule, SCHEDULES)
    _one_of("ppo.rollout_is", p.rollout_is, ("off", "token", "sequence"))
    _one_of("gen.backend", cfg.gen.backend, ("meshrl", "vllm"))
    if p.decoupled and cfg.algo not in ("ppo", "grpo", "remax", "rloo"):
        raise UserError(f"ppo.decoupled is a policy-gradient objective; algo={cfg.algo} has no policy loss")
    if not p.rollout_is_cap >= 1.0:
        raise UserError(f"ppo.rollout_is_cap must be >= 1 (weights are truncated from above), got {p.rollout_is_cap}")
    if p.rollout_mask_above is not None and not p.rollout_mask_above > 0.0:
        raise UserError(f"ppo.rollout_mask_above must be > 0 (or none), got {p.rollout_mask_above}")
    if not 0.0 <= p.clip < 1.0:
        raise UserError(f"ppo.clip must be in [0, 1), got {p.clip}")
    if p.clip_high is not None and p.clip_high < 0.0:
        raise UserError(f"ppo.clip_high must be >= 0, got {p.clip_high}")
    if p.dual_clip != 0.0 and p.dual_clip <= 1.0:
        raise UserError(f"ppo.dual_clip must be 0 (off) or > 1, got {p.dual_clip}")
    if o.warmup < 0:
        raise UserError(f"optim.warmup must be >= 0 optimizer steps, got {o.warmup}")
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        raise UserError(f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    if cfg.data.filter_rounds < 1:
        raise UserError(f"data.filter_rounds must be >= 1, got {cfg.data.filter_rounds}")
    if cfg.data.filter_groups and cfg.algo not in ("ppo", "grpo", "remax", "rloo"):
        raise UserError(f"data.filter_groups=true is for ppo, grpo, remax and rloo, not algo={cfg.algo}")
    if cfg.data.filter_groups and cfg.algo not in ("grpo", "rloo") and cfg.data.samples_per_prompt < 2:
        raise UserError("data.filter_groups=true needs groups: data.samples_per_prompt >= 2 (or algo=grpo/rloo)")
    if cfg.data.chat_template and cfg.models.actor.path is None:
        raise UserError("data.chat_template=true needs models.actor.path (a checkpoint with a chat template); "
                        "the built-in presets have none")
    if cfg.data.chat_template:
        load_chat_template(cfg.models.actor.path)
    e = cfg.eval
    if e.every < 1:
        raise UserError(f"eval.every must be >= 1 iterations, got {e.every}")
    if e.samples < 1:
        raise UserError(f"eval.samples must be >= 1, got {e.samples}")
    if e.path is not None and not Path(e.path).is_file():
        raise UserError(f"eval.path: file not found: {e.path}")
    if e.path is not None and cfg.algo == "rm":
        raise UserError("eval.path evaluates a policy; algo=rm trains no policy")
    validate_reward(cfg)
    validate_env(cfg)
