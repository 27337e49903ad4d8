"""The config keys as ``meshrl train --help`` lists them: every key of meshrl/config.py with its
type, default and the comment written beside it there (read from the source, so the list cannot
drift from the dataclasses)."""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from pathlib import Path
from .. import config
from ..config import Config


@functools.lru_cache(maxsize=1)
def _all_comments() -> dict[tuple[str, str], str]:
    """(class name, field) -> the comment on the field's line (and the comment lines right below
    it) in meshrl/config.py, read once (inspect.getsource per class took a second)."""

    out: dict[tuple[str, str], str] = {}
    cls = current = None
    for line in Path(config.__file__).read_text().splitlines():
        if m := re.match(r"class (\w+)", line):
            cls, current = m.group(1), None
        elif cls and (m := re.match(r"    (\w+): [^=]+=.*?(?:#\s*(.*))?$", line)):
            current = m.group(1)
            out[(cls, current)] = (m.group(2) or "").strip()
        elif cls and current and re.match(r"\s+#", line):
            out[(cls, current)] = (out[(cls, current)] + " " + line.strip().lstrip("#").strip()).strip()
        else:
            current = None
    return out


def _comments(cls) -> dict[str, str]:
    return {f: c for (k, f), c in _all_comments().items() if k == cls.__name__}


def _type_name(tp) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return f"{_type_name(args[0])} or none"
    return getattr(tp, "__name__", str(tp))


def config_keys(cls=None, prefix: str = "", obj=None) -> list[tuple[str, str, str, str]]:
    """(key, type, default, comment) for every leaf key, in declaration order."""

    cls = cls or Config
    obj = obj if obj is not None else cls()
    hints, notes = typing.get_type_hints(cls), _comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            rows += config_keys(type(value), f"{prefix}{f.name}.", value)
        else:
            rows.append((f"{prefix}{f.name}", _type_name(hints[f.name]), repr(value) if isinstance(value, str)
                         else str(value).lower() if value is None or isinstance(value, bool) else str(value),
                         notes.get(f.name, "")))
    return rows


@functools.lru_cache(maxsize=1)
def config_epilog() -> str:
    rows = config_keys()
    width = max(len(k) + len(d) + 1 for k, _, d, _ in rows)
    lines = ["config keys (key=value on the command line, or nested in CONFIG.yaml; the default shown; with no",
             "config file and no data.path, the built-in demo first sets its own sizes per algo):"]
    for key, tp, default, note in rows:
        lines.append(f"  {key}={default}".ljust(width + 3) + f"  {tp}" + (f": {note}" if note else ""))
    return "\n".join(lines)
