"""The output directory of ``meshrl train``: an existing run is never replaced without being asked.

A directory holding a run (any of the files a run writes) is refused unless the command says what
to do with it: ``--resume`` continues it, ``--overwrite`` replaces it (only the run's own files
are removed; anything else in the directory stays), or a new ``--out`` leaves it alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import UserError
import yaml
from ..config import to_dict

# What a run writes into OUT (meshrl/runtime/checkpoint.py, run.py, warmup.py, observe/, the exported model).
RUN_ENTRIES = ("config.yaml", "plan.json", "metrics.jsonl", "trace.json", "tensorboard", "actor", "reward",
               "sft-warmup", ".ranks", ".ckpt-tmp")
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


# What --resume may change: more iterations (DESIGN.md), how long ranks wait for each other, and
# the cluster (plans change speed, never results: --nprocs and --plan may change too).
RESUME_MAY_CHANGE = ("train.iterations", "train.timeout", "train.threads", "train.save_every", "cluster.nodes",
                     "cluster.devices_per_node", "cluster.device", "replan.every", "replan.min_gain",
                     "replan.search_steps")


def _flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume_config(out: Path, cfg) -> None:
    """--resume continues the run in ``out`` as it was configured: a config that differs from its
    config.yaml (other than RESUME_MAY_CHANGE) would silently make a different run; refuse it."""

    saved_file = out / "config.yaml"
    if not saved_file.is_file():
        return
    try:
        saved = _flat(yaml.safe_load(saved_file.read_text()) or {})
    except yaml.YAMLError as e:
        raise UserError(f"--resume: {saved_file} is not valid YAML ({e})") from None
    now = _flat(to_dict(cfg))
    if now.get("train.off_policy") == "auto" and isinstance(saved.get("train.off_policy"), int):
        now["train.off_policy"] = saved["train.off_policy"]  # the lag auto chose when the run started
    for key in ("train.compile", "gen.compile"):  # so what compile=auto chose
        if now.get(key) == "auto" and isinstance(saved.get(key), bool):
            now[key] = saved[key]
    differ = [k for k in sorted(set(saved) | set(now)) if k not in RESUME_MAY_CHANGE and saved.get(k) != now.get(k)]
    if differ:
        shown = ", ".join(f"{k}: {saved.get(k)!r} in the run, {now.get(k)!r} now" for k in differ[:3])
        raise UserError(f"--resume: this command configures another run than the one in {out} ({shown}"
                        f"{', ...' if len(differ) > 3 else ''}); give the run's own settings (only "
                        f"{', '.join(RESUME_MAY_CHANGE)} may change), or another --out")


def clear_run(out: Path) -> None:
    """Remove the run's own files from ``out`` (``--overwrite``, after every input was checked)."""
    for p in run_entries(out):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
