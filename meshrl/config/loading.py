"""Reading a config: defaults <- YAML file <- dotted ``key=value`` overrides, each value converted to
its key's type; then the algorithm's defaults filled in (:func:`with_algo_defaults`) and the whole
validated. An unknown key is an error naming it, never silently ignored."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import yaml

from ..errors import UserError
from .data import default_samples_per_prompt
from .fields import field_types
from .models import ModelSpec
from .run_config import Config


def _coerce(value: object, tp: object, key: str) -> object:
    """Convert a YAML/CLI value to the annotated type, or raise UserError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        for tp_i in args[:-1]:  # int | str: a number where it reads as one, else the word
            try:
                return _coerce(value, tp_i, key)
            except UserError:
                continue
        return _coerce(value, args[-1], key)
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
                return bool(value)
            raise ValueError(value)  # 2, 0.5, a list: not a yes or a no
        if typing.get_origin(tp) is list:
            items = [] if value is None else value if isinstance(value, list) else [value]
            (item_tp,) = typing.get_args(tp)
            return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(items)]
        if tp in (int, float, str):
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return tp(value)
    except (TypeError, ValueError):
        raise UserError(f"config key {key}: cannot read {value!r} as {getattr(tp, '__name__', tp)}") from None
    return value


def _apply(obj: object, data: dict, prefix: str = "") -> None:
    hints = field_types(type(obj))
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


def with_algo_defaults(cfg: Config) -> Config:
    """A copy of ``cfg`` with each setting left unset for "the algorithm's default" given its value:
    ``data.samples_per_prompt`` (4 for grpo and rloo, 1 otherwise). ``cfg`` itself is unchanged."""
    if cfg.data.samples_per_prompt is not None:
        return cfg
    data = dataclasses.replace(cfg.data, samples_per_prompt=default_samples_per_prompt(cfg.algo))
    return dataclasses.replace(cfg, data=data)


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- dotted overrides, the algorithm's defaults filled in, validated.
    Errors name the file or the key."""
    cfg = Config()
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
    cfg = with_algo_defaults(cfg)
    cfg.validate()
    return cfg


def to_dict(cfg: object) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: object) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
