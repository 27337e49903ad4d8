"""Loading the user's own code named in the config: ``path/to/file.py:name`` or ``module:name``.

One loader for every hook a run takes from the user: reward functions (``reward.fn``,
user_rewards.py) and environments (``env.fn``, env.py). A file is imported once per process; a
missing file, an import that fails or a missing name is one UserError naming the config key.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ..errors import UserError

_MODULES: dict[Path, object] = {}


def load_user_object(spec: str, key: str, what: str = "function") -> tuple[object, str, str]:
    """``file.py:name`` or ``module:name`` -> (the object, its name, where its code lives). ``what``
    names the expected kind in errors ("function", "class"). UserError naming ``key`` otherwise."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise UserError(f"{key}={spec!r}: expected path/to/file.py:{what} or package.module:{what}")
    if target.endswith(".py") or "/" in target:
        module, where = _import_file(spec, key, target), str(Path(target).resolve())
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise UserError(f"{key}={spec!r}: cannot import module {target}: {type(e).__name__}: {e}") from None
        where = getattr(module, "__file__", None) or target
    obj = getattr(module, name, None)
    if obj is None or not callable(obj):
        raise UserError(f"{key}={spec!r}: {where} has no {what} {name!r}")
    return obj, name, where


def _import_file(spec: str, key: str, target: str) -> object:
    path = Path(target).resolve()
    if not path.is_file():
        raise UserError(f"{key}={spec!r}: file {target} not found")
    if path in _MODULES:
        return _MODULES[path]
    mod_name = f"meshrl_user_code_{abs(hash(str(path)))}"
    try:
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        loader_spec.loader.exec_module(module)
    except Exception as e:  # the user's file failed to import: say which and why
        raise UserError(f"{key}={spec!r}: importing {target} failed: {type(e).__name__}: {e}") from None
    _MODULES[path] = module
    return module
