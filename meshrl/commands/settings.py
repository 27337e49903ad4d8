"""A run's settings as the commands load them: the config's sections, each checked where it is
defined (meshrl/config/), then the names and files that other packages own, each checked by its
owner: the algorithm's recipe settings (meshrl/algo/recipe_config.py: loss variants, LR schedule,
reward functions, environments, eval files), the model presets (meshrl/model/presets.py) and the
devices (meshrl/plan/hardware.py). One UserError naming the key, before anything runs.

Why here and not in meshrl/config/: the config is the bottom layer that every package reads, so
it cannot import the packages whose names it would check without closing an import cycle.
"""

from __future__ import annotations

from ..algo.recipe_config import validate_recipes
from ..config import Config, load_config
from ..errors import UserError
from ..model.presets import PRESETS as MODELS
from ..plan.hardware import device_names


def load_settings(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- dotted overrides (meshrl/config/), then every owner's checks."""
    cfg = load_config(path, overrides)
    check_owned(cfg)
    return cfg


def check_owned(cfg: Config) -> None:
    """The checks of the keys whose allowed values other packages define."""
    device = cfg.cluster.device
    if device not in device_names():
        raise UserError(f"config key cluster.device: unknown device {device!r}; known devices: "
                        f"{', '.join(d for d in device_names() if d != 'cpu')}, cpu (measured)")
    for role, spec in vars(cfg.models).items():
        if spec.path is None and spec.preset is not None and spec.preset not in MODELS:
            raise UserError(f"config key models.{role}.preset: unknown model preset {spec.preset!r}; known presets: "
                            f"{', '.join(MODELS)}")
    validate_recipes(cfg)  # loss variants, LR schedule, rewards, environments, eval
