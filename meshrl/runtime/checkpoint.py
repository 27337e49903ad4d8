"""Checkpoints: atomic, sharded by rank, exact on resume; the trained model (actor, or reward for
algo=rm) exported as an HF checkpoint.

    OUT/ckpt-000004/ rank0.pt .. rankN.pt   each rank's home shards of every role it holds, with
                                              their ZeRO optimizer state and the rank's RNG state
                     plan.json meta.json       the plan they were written under; iteration, world

Atomic: the ranks write into ``OUT/.ckpt-tmp``; after a barrier rank 0 writes meta.json and renames
the directory (one rename, atomic on POSIX), then deletes older checkpoints. A crash at any moment
leaves either the previous complete checkpoint or the new one, never a half-written one that loads.
The data position is the iteration: every choice of data is keyed by (seed, iteration).
Only home placements are saved: every copy is refreshed by a reallocation step before its next use.

With async generation the generation of iteration t+1 runs before update t, from weights one update
old, so the checkpoint after t also holds what that generation left on each rank (``ahead``: its
output rows on the dp holders, and the rank's log of t+1 so far); meta.json names the iteration
(``"ahead": t+1``). Resume restores them and skips that generation (meshrl/runtime/run.py). They
are written in the same rank files, so they are as atomic as the weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from ..parallel import comm

from .roles import RoleModels

PREFIX = "ckpt-"


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint directory under ``out`` (one with meta.json), else None."""
    done = [p for p in Path(out).glob(f"{PREFIX}*") if (p / "meta.json").is_file()]
    return max(done, key=lambda p: int(p.name[len(PREFIX):])) if done else None


def _rank_state(roles: dict[str, RoleModels]) -> dict:
    state: dict = {"rng": torch.get_rng_state(), "roles": {}}
    for name, rm in roles.items():
        pm = rm.models.get(rm.home)
        if pm is None:
            continue
        state["roles"][name] = {"params": {k: v.clone() for k, v in pm.local_state().items()},
                                "optim": pm.optimizer.state_dict() if pm.optimizer is not None else None}
    return state


def save_checkpoint(out: str | Path, iteration: int, roles: dict[str, RoleModels], plan_json: str,
                    keep: int = 1, ahead: dict | None = None) -> Path:
    """Collective over all ranks: write the state after ``iteration``; returns the final directory.
    ``ahead``: this rank's state of iteration+1 computed already (async generation; given on every
    rank or on none), restored by ``load_checkpoint``."""
    out = Path(out)
    tmp, final = out / ".ckpt-tmp", out / f"{PREFIX}{iteration:06d}"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    comm.barrier(comm.control(None))
    state = _rank_state(roles)
    if ahead is not None:
        state["ahead"] = ahead
    torch.save(state, tmp / f"rank{rank}.pt")
    comm.barrier(comm.control(None))
    if rank == 0:
        (tmp / "plan.json").write_text(plan_json)
        meta = {"iteration": iteration, "world": dist.get_world_size(),
                "ahead": iteration + 1 if ahead is not None else None}
        (tmp / "meta.json").write_text(json.dumps(meta))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        old = sorted((p for p in out.glob(f"{PREFIX}*") if p != final), key=lambda p: p.name)
        for p in old[:max(0, len(old) - keep + 1)]:
            shutil.rmtree(p, ignore_errors=True)
    comm.barrier(comm.control(None))
    return final


def load_checkpoint(path: str | Path, roles: dict[str, RoleModels]) -> tuple[int, dict | None]:
    """Restore this rank's home shards, optimizer state and RNG; returns the saved iteration and the
    rank's ``ahead`` state of the next iteration (None when the checkpoint has none)."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    if meta["world"] != dist.get_world_size():
        from ..errors import UserError

        raise UserError(f"checkpoint {path} was written by {meta['world']} ranks; this run has "
                        f"{dist.get_world_size()}")
    state = torch.load(path / f"rank{dist.get_rank()}.pt", weights_only=False)
    torch.set_rng_state(state["rng"])
    for name, saved in state["roles"].items():
        pm = roles[name].models[roles[name].home]
        pm.load_local_state(saved["params"])
        if saved["optim"] is not None:
            pm.optimizer.load_state_dict(saved["optim"])
    if meta.get("ahead") is not None and "ahead" not in state:
        raise RuntimeError(f"checkpoint {path}: meta.json says iteration {meta['ahead']} was generated "
                           f"ahead, but rank{dist.get_rank()}.pt does not hold it")
    return int(meta["iteration"]), state.get("ahead")


def export_trained(roles: dict[str, RoleModels], algo: str, out: str | Path, tok=None) -> Path | None:
    """Collective over the exported role's home mesh: save the trained model as a Hugging Face
    checkpoint at OUT/reward for algo=rm, else OUT/actor (as the single-process trainer does),
    written shard by shard by the ranks holding it (runtime/export.py); returns the path on the
    mesh's first rank (None on the others)."""
    from .export import export_sharded

    name = "reward" if algo == "rm" else "actor"
    rm = roles.get(name)
    if rm is None or rm.home not in rm.models:
        return None
    return export_sharded(rm.models[rm.home], Path(out) / name, tok)
