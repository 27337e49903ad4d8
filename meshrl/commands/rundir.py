"""The output directory of ``meshrl train``: an existing run is never replaced without being asked.

A directory holding a run (any of the files a run writes) is refused unless the command says what
to do with it: ``--resume`` continues it, ``--overwrite`` replaces it (only the run's own files
are removed; anything else in the directory stays), or a new ``--out`` leaves it alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import UserError

# What a run writes into OUT (meshrl/runtime/checkpoint.py, run.py, observe/, the exported model).
RUN_ENTRIES = ("config.yaml", "plan.json", "metrics.jsonl", "trace.json", "tensorboard", "actor", "reward",
               ".ranks", ".ckpt-tmp")
CKPT_GLOB = "ckpt-*"


def run_entries(out: Path) -> list[Path]:
    """The run's own files and directories present in ``out`` (empty if it holds no run)."""
    if not out.is_dir():
        return []
    found = [out / n for n in RUN_ENTRIES if (out / n).exists() or (out / n).is_symlink()]
    return found + sorted(out.glob(CKPT_GLOB))


def check_out(out: Path, resume: bool, overwrite: bool) -> None:
    """UserError, before anything is written, if ``out`` cannot be used as the command asks."""
    if resume and overwrite:
        raise UserError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    found = run_entries(out)
    if found and not resume and not overwrite:
        names = ", ".join(p.name for p in found[:4]) + (", ..." if len(found) > 4 else "")
        raise UserError(f"--out {out} already holds a run ({names}); add --resume to continue it, choose "
                        "another --out, or add --overwrite to replace it")


def clear_run(out: Path) -> None:
    """Remove the run's own files from ``out`` (``--overwrite``, after every input was checked)."""
    for p in run_entries(out):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
