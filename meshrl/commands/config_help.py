"""The config keys as ``meshrl train --help`` lists them: every leaf key of meshrl/config/ with its
type, default and the help text declared on its field (``setting(..., help)``), so the list cannot
drift from the dataclasses."""

from __future__ import annotations

import functools

from ..config import Config
from ..config.fields import field_types, leaf_fields, type_name


def _shown(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    return str(value).lower() if value is None or isinstance(value, bool) else str(value)


def config_keys(obj: object | None = None) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every leaf key, in declaration order."""
    rows = []
    for key, (f, cls, value) in leaf_fields(obj if obj is not None else Config()).items():
        rows.append((key, type_name(field_types(cls)[f.name]), _shown(value), f.metadata.get("help", "")))
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
