"""The run configuration: typed dataclasses, read from YAML and overridden by dotted ``key=value``.

One config system for every tool (train, plan, check): a key means one thing everywhere, and an
unknown key is an error naming the key, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import UserError

ALGOS = ("ppo", "grpo", "remax", "rloo", "dpo", "sft", "rm")


@dataclass
class ModelSpec:
    """A model for one role: a size preset (random init, for planning/benchmarks) or a local HF dir."""

    preset: str | None = None
    path: str | None = None


@dataclass
class ModelsConfig:
    actor: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))
    critic: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))
    ref: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))
    reward: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))


@dataclass
class DataConfig:
    prompt_len: int = 16  # maximum prompt tokens
    gen_len: int = 16  # maximum generated tokens per response
    batch_size: int = 32  # prompts per iteration
    samples_per_prompt: int = 1  # responses sampled per prompt (GRPO/RLOO use > 1)
    path: str | None = None  # JSONL dataset; None = the built-in demo task


@dataclass
class ClusterConfig:
    nodes: int = 1
    devices_per_node: int = 1
    device: str = "cpu"  # a100-80g | h100-80g | h200 | cpu (measured by `meshrl profile`)


@dataclass
class TrainConfig:
    iterations: int = 20
    seed: int = 1


@dataclass
class Config:
    algo: str = "ppo"
    models: ModelsConfig = field(default_factory=ModelsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        if self.algo not in ALGOS:
            raise UserError(f"algo={self.algo!r} is not one of {', '.join(ALGOS)}")
        for name in ("nodes", "devices_per_node"):
            if getattr(self.cluster, name) < 1:
                raise UserError(f"cluster.{name} must be >= 1, got {getattr(self.cluster, name)}")


def _field_types(cls) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _coerce(value: object, tp: object, key: str) -> object:
    """Convert a YAML/CLI value to the annotated type, or raise UserError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], key)
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if tp in (int, float, str):
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return tp(value)
    except (TypeError, ValueError):
        raise UserError(f"config key {key}: cannot read {value!r} as {getattr(tp, '__name__', tp)}") from None
    return value


def _apply(obj: object, data: dict, prefix: str = "") -> None:
    hints = _field_types(type(obj))
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in hints:
            known = ", ".join(f"{prefix}{n}" for n in hints)
            raise UserError(f"unknown config key {key!r}; known keys here: {known}")
        cur = getattr(obj, k)
        if dataclasses.is_dataclass(cur):
            if isinstance(v, str) and isinstance(cur, ModelSpec):  # models.actor=small shorthand
                v = {"path": v} if ("/" in v or Path(v).exists()) else {"preset": v}
            if not isinstance(v, dict):
                raise UserError(f"config key {key} must be a mapping, got {v!r}")
            _apply(cur, v, key + ".")
        else:
            setattr(obj, k, _coerce(v, hints[k], key))


def parse_overrides(items: list[str]) -> dict:
    """["a.b=1", "c=x"] -> nested dict {"a": {"b": "1"}, "c": "x"} (values parsed as YAML scalars)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            val = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            val = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = val
    return out


def load_config(path: str | None = None, overrides: list[str] | None = None, cls=Config) -> Config:
    """Defaults <- YAML file <- dotted overrides; validated. Errors name the file or the key."""
    cfg = cls()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise UserError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise UserError(f"config file {path} must hold a mapping at the top level")
        _apply(cfg, data)
    _apply(cfg, parse_overrides(overrides or []))
    cfg.validate()
    return cfg


def to_dict(cfg: object) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: object) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
