"""The run configuration: typed dataclasses, read from YAML and overridden by dotted ``key=value``.

One config system for every tool (train, plan, check): a key means one thing everywhere, and an
unknown key is an error naming the key, never silently ignored. Each key is declared once, with
its help text and allowed values (:func:`meshrl.config.fields.setting`), in the file of its
section; each section validates itself; the config imports nothing of meshrl but ``errors``.

  fields.py      setting(): default, help, range, choices; the generic per-field check
  data.py        data (prompts, batch sizes, the planner's expected lengths)
  models.py      models (a preset or a checkpoint per role), cluster
  train.py       train (the run and the runtime's knobs), optim, replan
  policy.py      ppo, sft, dpo
  rollout.py     gen, reward, env, eval
  run_config.py  Config: the sections assembled, the rules between sections
  loading.py     load_config: defaults <- YAML <- overrides, algorithm defaults, validation
"""

from __future__ import annotations

from .data import DataConfig, default_samples_per_prompt
from .loading import dump_yaml, load_config, parse_overrides, to_dict, with_algo_defaults
from .models import ClusterConfig, ModelsConfig, ModelSpec, own_model, role_spec
from .policy import DPOConfig, PPOConfig, SFTConfig
from .rollout import EnvConfig, EvalConfig, GenConfig, RewardConfig
from .run_config import ALGOS, Config
from .train import OptimConfig, ReplanConfig, TrainConfig

__all__ = ["ALGOS", "ClusterConfig", "Config", "DPOConfig", "DataConfig", "EnvConfig", "EvalConfig", "GenConfig",
           "ModelSpec", "ModelsConfig", "OptimConfig", "PPOConfig", "ReplanConfig", "RewardConfig", "SFTConfig",
           "TrainConfig", "default_samples_per_prompt", "dump_yaml", "load_config", "own_model", "parse_overrides",
           "role_spec", "to_dict", "with_algo_defaults"]
