"""How a config key is declared and checked: its default, its help text (what ``meshrl train --help``
prints) and its allowed values all sit on the field itself, as ``dataclasses.field(metadata=...)``
(the way Hugging Face's TrainingArguments attaches help), and one generic check runs over a
section's fields: the type, no empty string, no nan or infinity, the range, the choices.

A section's own ``validate`` calls :func:`check_fields` and then adds the rules between its fields;
a key without a range has none beyond its type (a seed, or ``ppo.kl_coef`` = 0, which turns the KL
term off).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

from ..errors import UserError


@dataclasses.dataclass(frozen=True)
class Range:
    """The allowed interval of a numeric key: ``lo`` (inclusive when ``lo_ok``) up to ``hi``
    (inclusive when ``hi_ok``); None: no bound on that side."""

    lo: float | None = None
    lo_ok: bool = True
    hi: float | None = None
    hi_ok: bool = True

    def allows(self, v: float) -> bool:
        above = self.lo is None or (v >= self.lo if self.lo_ok else v > self.lo)
        below = self.hi is None or (v <= self.hi if self.hi_ok else v < self.hi)
        return above and below

    def describe(self) -> str:
        """'>= 1', '> 0 and <= 1', ..."""
        parts = [] if self.lo is None else [f"{'>=' if self.lo_ok else '>'} {self.lo:g}"]
        parts += [] if self.hi is None else [f"{'<=' if self.hi_ok else '<'} {self.hi:g}"]
        return " and ".join(parts)


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING,
            at_least: float | None = None, above: float | None = None, at_most: float | None = None,
            below: float | None = None, choices: tuple[str, ...] | None = None, unit: str = "",
            why: str = "") -> Any:
    """A config field: ``setting(16, "maximum prompt tokens", at_least=1)``. ``help`` is required
    (every key is documented where it is declared); the bounds and choices are checked by
    :func:`check_fields` when the config is validated, whose message names the bound's ``unit``
    and ``why`` the bound holds, where given."""
    if not help.strip():
        raise ValueError("every config setting needs its help text")
    lo, lo_ok = (at_least, True) if at_least is not None else (above, False)
    hi, hi_ok = (at_most, True) if at_most is not None else (below, False)
    bounds = Range(lo, lo_ok, hi, hi_ok) if lo is not None or hi is not None else None
    meta = {"help": " ".join(help.split()), "range": bounds, "choices": choices, "unit": unit, "why": why}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def help_text(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def value_range(f: dataclasses.Field) -> Range | None:
    return f.metadata.get("range")


def value_choices(f: dataclasses.Field) -> tuple[str, ...] | None:
    return f.metadata.get("choices")


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, object]:
    """Field name -> its annotated type (resolved once per class)."""
    return typing.get_type_hints(cls)


def type_name(tp: object) -> str:
    """int, float or none, list of str, ... (as --help and the error messages spell types)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if args == [bool, str]:  # a switch the run may resolve itself (check_switch)
            return "true, false or auto"
        return " or ".join(type_name(a) for a in args) + (" or none" if type(None) in typing.get_args(tp) else "")
    if typing.get_origin(tp) is list:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _is(value: object, tp: object) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_is(value, a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return isinstance(value, list) and all(_is(v, typing.get_args(tp)[0]) for v in value)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp) if isinstance(tp, type) else True


def check_fields(section: object, name: str) -> None:
    """UserError naming the first of ``section``'s keys (``name.field``) whose value has the wrong
    type, is an empty string, is not finite, or lies outside its range or choices. Nested sections
    are their owners' to check."""
    hints = field_types(type(section))
    for f in dataclasses.fields(section):
        v, key = getattr(section, f.name), f"{name}.{f.name}"
        if dataclasses.is_dataclass(v):
            continue
        if not _is(v, hints[f.name]):
            raise UserError(f"config key {key} must be {type_name(hints[f.name])}, got {v!r}")
        if isinstance(v, str) and v == "":
            hint = " (or none)" if key.endswith(".path") else ""
            raise UserError(f"config key {key} is empty; give a value{hint}")
        if isinstance(v, float) and not math.isfinite(v):
            raise UserError(f"config key {key} must be a finite number, got {v}")
        bounds, choices = value_range(f), value_choices(f)
        if bounds is not None and v is not None and not isinstance(v, bool) and not bounds.allows(v):
            unit, why = f.metadata.get("unit"), f.metadata.get("why")
            optional = _is(None, hints[f.name])
            raise UserError(f"config key {key} must be {bounds.describe()}" + (f" {unit}" if unit else "")
                            + (" (or none)" if optional else "") + (f" ({why})" if why else "") + f", got {v}")
        if choices is not None and v not in choices:
            raise UserError(f"{key}={v!r} is not one of {', '.join(choices)}")


def check_switch(value: object, key: str) -> None:
    """UserError unless ``value`` is true, false or auto (a setting the run may resolve itself)."""
    if not isinstance(value, bool) and value != "auto":
        raise UserError(f"config key {key} must be true, false or auto, got {value!r}")


def leaves(obj: object, prefix: str = "") -> dict[str, object]:
    """Every leaf key of a config dataclass -> its value."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out.update(leaves(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v) else {f"{prefix}{f.name}": v})
    return out


def leaf_fields(obj: object, prefix: str = "") -> dict[str, tuple[dataclasses.Field, type, object]]:
    """Every leaf key -> (its field, the class declaring it, its value in ``obj``), in declaration order."""
    out: dict[str, tuple[dataclasses.Field, type, object]] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out.update(leaf_fields(v, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (f, type(obj), v)
    return out
