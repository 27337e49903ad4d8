"""The ``models`` section (which model plays each role) and the ``cluster`` section (the devices
it runs on). The preset and device names are checked by their owners (meshrl/model/presets.py,
meshrl/plan/hardware.py; see meshrl/commands/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .fields import check_fields, setting


@dataclass
class ModelSpec:
    """A model for one role: a size preset (random init, for planning/benchmarks) or a local HF dir."""

    preset: str | None = setting(None, "a size preset (random init): tiny, small, llama2-7b, ... "
                                 "(meshrl/model/presets.py); models.ROLE=NAME is short for it")
    path: str | None = setting(None, "a local Hugging Face checkpoint directory (used instead of the preset); "
                               "models.ROLE=DIR is short for it")

    def validate(self, name: str) -> None:
        check_fields(self, name)


def _tiny() -> ModelSpec:
    return ModelSpec(preset="tiny")


@dataclass
class ModelsConfig:
    """Which model each role runs. A role other than the actor that names neither a preset nor a
    path starts from the actor (:func:`role_spec`, :func:`own_model`)."""

    actor: ModelSpec = setting(help="the policy: generates and is trained", factory=_tiny)
    critic: ModelSpec = setting(help="the value model (ppo); unset: the actor's backbone with a value head",
                                factory=ModelSpec)
    ref: ModelSpec = setting(help="the frozen reference policy of the KL term; unset: the actor",
                             factory=ModelSpec)
    reward: ModelSpec = setting(help="the reward model (a path; else reward.rule or reward.fn scores; "
                                "algo=rm: unset is the actor's backbone with a value head)", factory=ModelSpec)

    def validate(self, name: str = "models") -> None:
        for f in fields(self):
            getattr(self, f.name).validate(f"{name}.{f.name}")


def own_model(models: ModelsConfig, role: str) -> bool:
    """Whether ``role`` has a model of its own: a path, or a preset other than the actor's (the
    actor's preset again, or nothing, means the role starts from the actor: the reference a copy of
    it, a critic or reward model its backbone with a value head)."""
    spec, actor = getattr(models, role), models.actor
    if role == "actor" or spec.path:
        return True
    return spec.preset is not None and (actor.path is not None or spec.preset != actor.preset)


def role_spec(models: ModelsConfig, role: str) -> ModelSpec:
    """The spec ``role``'s model is built from and priced at (the runtime and the planner both read
    it): the role's own when :func:`own_model`, else the actor's."""
    return getattr(models, role) if own_model(models, role) else models.actor


@dataclass
class ClusterConfig:
    nodes: int = setting(1, "machines", at_least=1)
    devices_per_node: int = setting(1, "devices (GPUs, or CPU ranks) per machine", at_least=1)
    device: str = setting("cpu", "a100-80g | h100-80g | h200 | cpu (measured by meshrl profile)")

    def validate(self, name: str = "cluster") -> None:
        check_fields(self, name)
