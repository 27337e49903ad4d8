"""The config keys as ``meshrl train --help`` lists them: every key of meshrl/config.py with its
type, default and the comment written beside it there (read from the source, so the list cannot
drift from the dataclasses)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing


def _comments(cls) -> dict[str, str]:
    """field -> the comment on its line (and the comment lines right below it) in the class source."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    current = None
    for line in lines:
        m = re.match(r"\s+(\w+): [^=]+=.*?(?:#\s*(.*))?$", line)
        if m:
            current = m.group(1)
            out[current] = (m.group(2) or "").strip()
        elif current and re.match(r"\s+#", line):
            out[current] = (out[current] + " " + line.strip().lstrip("#").strip()).strip()
        else:
            current = None
    return out


def _type_name(tp) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return f"{_type_name(args[0])} or none"
    return getattr(tp, "__name__", str(tp))


def config_keys(cls=None, prefix: str = "", obj=None) -> list[tuple[str, str, str, str]]:
    """(key, type, default, comment) for every leaf key, in declaration order."""
    from ..config import Config

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


def config_epilog() -> str:
    rows = config_keys()
    width = max(len(k) + len(d) + 1 for k, _, d, _ in rows)
    lines = ["config keys (key=value on the command line, or nested in CONFIG.yaml; the default shown; with no",
             "config file and no data.path, the built-in demo first sets its own sizes per algo):"]
    for key, tp, default, note in rows:
        lines.append(f"  {key}={default}".ljust(width + 3) + f"  {tp}" + (f": {note}" if note else ""))
    return "\n".join(lines)
