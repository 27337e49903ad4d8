"""The algorithm's own checks of its recipe settings: the keys whose allowed values algo defines
(ppo.loss_agg, ppo.ratio, ppo.rollout_is, optim.schedule, reward.rule / fn, env.fn), the rules that
say which algorithms a setting applies to (ppo.decoupled, data.filter_groups, eval.path), and the
checks that read files or import user code (data.chat_template, eval.path, reward.fn, env.fn).
Types and ranges are the config sections' (meshrl/config/). One UserError naming the key, raised by
meshrl/commands/settings.py when a command loads its settings, so nothing bad reaches a rank."""

from __future__ import annotations

from pathlib import Path

from ..data.chat import load_chat_template
from ..errors import UserError
from .env import validate_env
from .losses import LOSS_AGGS, RATIOS
from .lr_schedule import SCHEDULES
from .user_rewards import validate_reward

POLICY_ALGOS = ("ppo", "grpo", "remax", "rloo")  # the algorithms with a policy-gradient loss
ROLLOUT_IS = ("off", "token", "sequence")  # meshrl/algo/mismatch.py


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r} is not one of {', '.join(allowed)}")


def validate_recipes(cfg) -> None:
    p = cfg.ppo
    _one_of("ppo.loss_agg", p.loss_agg, LOSS_AGGS)
    _one_of("ppo.ratio", p.ratio, RATIOS)
    _one_of("optim.schedule", cfg.optim.schedule, SCHEDULES)
    _one_of("ppo.rollout_is", p.rollout_is, ROLLOUT_IS)
    if p.decoupled and cfg.algo not in POLICY_ALGOS:
        raise UserError(f"ppo.decoupled is a policy-gradient objective; algo={cfg.algo} has no policy loss")
    if cfg.data.filter_groups and cfg.algo not in POLICY_ALGOS:
        raise UserError(f"data.filter_groups=true is for ppo, grpo, remax and rloo, not algo={cfg.algo}")
    if cfg.data.filter_groups and cfg.data.samples_per_prompt < 2:
        raise UserError("data.filter_groups=true needs groups: data.samples_per_prompt >= 2 (or algo=grpo/rloo)")
    if cfg.data.chat_template and cfg.models.actor.path is None:
        raise UserError("data.chat_template=true needs models.actor.path (a checkpoint with a chat template); "
                        "the built-in presets have none")
    if cfg.data.chat_template:
        load_chat_template(cfg.models.actor.path)
    e = cfg.eval
    if e.path is not None and not Path(e.path).is_file():
        raise UserError(f"eval.path: file not found: {e.path}")
    if e.path is not None and cfg.algo == "rm":
        raise UserError("eval.path evaluates a policy; algo=rm trains no policy")
    validate_reward(cfg)
    validate_env(cfg)
