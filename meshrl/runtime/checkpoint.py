"""Checkpoints that reshard: written under one plan and world size, read under any other.

    OUT/ckpt-000004/ rank0.safetensors ..   the rectangles of full tensors that each rank writes
                     rank0.json ..          what each rank wrote (key, offsets, sizes)
                     index.json             every key: full shape, dtype, chunks (file, offsets, sizes)
                     ahead0.pt ..           async generation's state of the iterations ahead (off-policy)
                     plan.json meta.json    the plan they were written under; iteration, world, format

The state of every role is saved in a layout-independent form (meshrl/runtime/shards.py): keys
are full parameter names, values are rectangles of the full tensors: the weights, and the ZeRO-1
fp32 master weights and AdamW moments cut out of flattened slices. Each rank writes what it holds,
and a chunk held by several ranks (data-parallel replicas, replicated slices) is written once, by
its first holder; no rank ever gathers a whole model. On resume each rank reads, for each
rectangle it needs under the new plan, just the overlapping parts of the stored chunks
(safetensors reads slices lazily). AdamW's step count and the (rank-independent) RNG state go in
index.json and rank 0's file; the LR schedule, the data order and every sampling stream are keyed
by (seed, iteration, ...) and need no state (meshrl/algo/lr_schedule.py, algo/common.py).

Why not ``torch.distributed.checkpoint``: its sharded types cannot hold this state as it is.
DTensor shards evenly over a DeviceMesh, while a ZeRO-1 chunk is a range of a flattened tp slice
(not a rectangle of the full tensor) and pipeline stages hold disjoint parameter sets; the
deprecated ShardedTensor needs per-tensor global metadata that covers the tensor without overlap
on every rank, also when loading a subset. Cutting chunks into rectangles ourselves leaves a
format of plain safetensors files plus a JSON index, read with the same slice arithmetic.

Atomic: the ranks write into ``OUT/.ckpt-tmp``; after a barrier rank 0 writes index.json and
meta.json and renames the directory (one rename, atomic on POSIX), then deletes older
checkpoints. A kill at any moment leaves the previous complete checkpoint or the new one.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from collections.abc import Callable
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import UserError
from ..parallel import comm
from .roles import RoleModels
from .shards import Piece, optimizer_step, role_pieces, set_optimizer_step
from .export import export_sharded

PREFIX = "ckpt-"
FORMAT = "meshrl-sharded/1"
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.uint8)}


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint directory under ``out`` (one with meta.json), else None."""
    done = [p for p in Path(out).glob(f"{PREFIX}*") if (p / "meta.json").is_file()]
    return max(done, key=lambda p: int(p.name[len(PREFIX):])) if done else None


def check_format(path: Path) -> dict:
    """meta.json of checkpoint ``path``; UserError naming it if an older meshrl wrote it."""
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise UserError(f"checkpoint {path} is in an older format (per-rank rank*.pt files, readable only by "
                        f"the same world size and plan); this meshrl reads {FORMAT} checkpoints. Resume it with "
                        "the meshrl that wrote it, or start the run again (--overwrite or another --out)")
    return meta


def _tensor_name(p: Piece) -> str:
    return f"{p.key}@{','.join(map(str, p.rect[0]))}"


def _rank_files(tmp: Path, rank: int, roles: dict[str, RoleModels], ahead: dict | None) -> None:
    """This rank's rectangles (the ones it writes), its list of them, and its ahead state."""
    pieces = [p for rm in roles.values() if rm.home in rm.models for p in role_pieces(rm.name, rm.models[rm.home], rank)
              if p.write]
    tensors = {_tensor_name(p): p.get().contiguous() for p in pieces}
    users = Counter(t.untyped_storage().data_ptr() for t in tensors.values())
    tensors = {k: t.clone() if users[t.untyped_storage().data_ptr()] > 1 else t for k, t in tensors.items()}
    if rank == 0:
        tensors["rng"] = torch.get_rng_state()  # equal on every rank (seeded alike; data RNG is keyed)
    save_file(tensors, tmp / f"rank{rank}.safetensors")
    steps = {rm.name: optimizer_step(rm.models[rm.home]) for rm in roles.values()
             if rm.home in rm.models and rm.models[rm.home].optimizer is not None}
    entries = [{"key": p.key, "tensor": _tensor_name(p), "shape": list(p.shape), "dtype": str(p.dtype),
                "offsets": list(p.rect[0]), "sizes": list(p.rect[1])} for p in pieces]
    (tmp / f"rank{rank}.json").write_text(json.dumps({"entries": entries, "steps": steps}))
    if ahead is not None:
        torch.save(ahead, tmp / f"ahead{rank}.pt")


def _index(tmp: Path, world: int) -> dict:
    """All ranks' lists as one index; checks that every key's chunks cover its tensor exactly."""
    tensors: dict[str, dict] = {}
    steps: dict[str, float] = {}
    for r in range(world):
        got = json.loads((tmp / f"rank{r}.json").read_text())
        steps.update(got["steps"])
        for e in got["entries"]:
            t = tensors.setdefault(e["key"], {"shape": e["shape"], "dtype": e["dtype"], "chunks": []})
            t["chunks"].append([f"rank{r}.safetensors", e["tensor"], e["offsets"], e["sizes"]])
    for key, t in tensors.items():
        have, want = sum(_numel(c[3]) for c in t["chunks"]), _numel(t["shape"])
        if have != want:
            raise RuntimeError(f"checkpoint: the ranks wrote {have} of the {want} elements of {key}")
    return {"format": FORMAT, "tensors": tensors, "steps": steps}


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def save_checkpoint(out: str | Path, iteration: int, roles: dict[str, RoleModels], plan_json: str,
                    keep: int = 1, ahead: dict | None = None, timeout_s: float = 300.0,
                    hook: Callable[[str, int], None] | None = None) -> Path:
    """Collective over all ranks: write the state after ``iteration``; returns the final directory.
    ``ahead``: this rank's state of the later iterations computed already, {iteration: state}
    (async generation; given on every rank or on none), restored by ``load_checkpoint``.
    ``hook("checkpoint", iteration)`` runs between this rank's files and the commit (the tests'
    kill in mid-save, runtime/faults.py)."""
    out = Path(out)
    tmp, final = out / ".ckpt-tmp", out / f"{PREFIX}{iteration:06d}"
    rank, world = dist.get_rank(), dist.get_world_size()
    wait = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    comm.barrier(comm.control(None), wait)
    _rank_files(tmp, rank, roles, ahead)
    if hook is not None:
        hook("checkpoint", iteration)
    comm.barrier(comm.control(None), wait)
    if rank == 0:
        (tmp / "index.json").write_text(json.dumps(_index(tmp, world)))
        (tmp / "plan.json").write_text(plan_json)
        meta = {"format": FORMAT, "iteration": iteration, "world": world,
                "ahead": sorted(ahead) if ahead is not None else None}
        (tmp / "meta.json").write_text(json.dumps(meta))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        old = sorted((p for p in out.glob(f"{PREFIX}*") if p != final), key=lambda p: p.name)
        for p in old[:max(0, len(old) - keep + 1)]:
            shutil.rmtree(p, ignore_errors=True)
    comm.barrier(comm.control(None), wait)
    return final


class ShardReader:
    """Reads any rectangle of any key of a checkpoint from the stored chunks that overlap it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index = json.loads((path / "index.json").read_text())
        self._open: dict[str, object] = {}

    def _file(self, name: str):
        if name not in self._open:
            self._open[name] = safe_open(str(self.path / name), framework="pt", device="cpu")
        return self._open[name]

    def has(self, key: str) -> bool:
        return key in self.index["tensors"]

    def read(self, key: str, offsets, sizes) -> torch.Tensor:
        """The rectangle (offsets, sizes) of the full tensor ``key``, on the CPU."""
        info = self.index["tensors"].get(key)
        if info is None:
            raise UserError(f"checkpoint {self.path} holds no {key} (was it written by another algorithm or model?)")
        shape = info["shape"]
        if len(sizes) != len(shape) or any(o + s > n for o, s, n in zip(offsets, sizes, shape, strict=True)):
            raise UserError(f"checkpoint {self.path}: {key} has shape {info['shape']}, which this run's model "
                            f"does not match (it needs [{offsets}, +{sizes}])")
        for fname, tname, c_off, c_size in info["chunks"]:  # the same layout: one whole chunk, no copy
            if list(c_off) == list(offsets) and list(c_size) == list(sizes):
                return self._file(fname).get_tensor(tname)
        out = torch.empty(tuple(sizes), dtype=_DTYPES[info["dtype"]])
        got = 0
        for fname, tname, c_off, c_size in info["chunks"]:
            lo = [max(a, b) for a, b in zip(offsets, c_off, strict=True)]
            hi = [min(a + s, b + t) for a, s, b, t in zip(offsets, sizes, c_off, c_size, strict=True)]
            if any(a >= b for a, b in zip(lo, hi, strict=True)):
                continue
            src = tuple(slice(a - c, b - c) for a, b, c in zip(lo, hi, c_off, strict=True))
            dst = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offsets, strict=True))
            out[dst] = self._file(fname).get_slice(tname)[src] if src else self._file(fname).get_tensor(tname)
            got += _numel([b - a for a, b in zip(lo, hi, strict=True)])
        if got != _numel(sizes):
            raise RuntimeError(f"checkpoint {self.path}: {key} [{offsets}, +{sizes}] is only partly stored")
        return out

    def full(self, key: str) -> torch.Tensor:
        """A whole tensor (tests and tools; the runtime reads only rectangles)."""
        shape = self.index["tensors"][key]["shape"]
        return self.read(key, [0] * len(shape), shape)


def load_checkpoint(path: str | Path, roles: dict[str, RoleModels], plan_json: str | None = None
                    ) -> tuple[int, dict | None]:
    """Restore every role's home state that this rank holds under the current plan (any plan and
    world size), the optimizer's step and the RNG. Returns the saved iteration and the ahead state
    of the later iterations: ``{"same": bool, "iterations": [...], "states": [{iteration: state}]}``
    with this rank's own saved states when the plan and world are the ones it was written under,
    else every rank's (resharded by meshrl/runtime/ahead.py), or None when the checkpoint has none."""
    path = Path(path)
    meta = check_format(path)
    reader = ShardReader(path)
    for rm in roles.values():
        pm = rm.models.get(rm.home)
        if pm is None:
            continue
        for p in role_pieces(rm.name, pm, dist.get_rank()):
            p.put(reader.read(p.key, p.rect[0], p.rect[1]).to(p.dtype))
        if pm.optimizer is not None:
            step = reader.index["steps"].get(rm.name)
            if step is None:
                raise UserError(f"checkpoint {path} holds no optimizer state of {rm.name}")
            set_optimizer_step(pm, step)
    torch.set_rng_state(reader._file("rank0.safetensors").get_tensor("rng"))
    if meta.get("ahead") is None:
        return int(meta["iteration"]), None
    same = meta["world"] == dist.get_world_size() and plan_json is not None and \
        json.loads(plan_json)["calls"] == json.loads((path / "plan.json").read_text())["calls"]
    ranks = [dist.get_rank()] if same else range(meta["world"])
    states = [torch.load(path / f"ahead{r}.pt", weights_only=False) for r in ranks]
    iterations = meta["ahead"]
    if isinstance(iterations, int):  # written by one-step-ahead meshrl: one iteration's state per rank
        iterations, states = [iterations], [{iterations: s} for s in states]
    return int(meta["iteration"]), {"same": same, "iterations": iterations, "states": states}


def export_trained(roles: dict[str, RoleModels], algo: str, out: str | Path, tok=None) -> Path | None:
    """Collective over the exported role's home mesh: save the trained model as a Hugging Face
    checkpoint at OUT/reward for algo=rm, else OUT/actor (as the single-process trainer does),
    written shard by shard by the ranks holding it (runtime/export.py); returns the path on the
    mesh's first rank (None on the others)."""

    name = "reward" if algo == "rm" else "actor"
    rm = roles.get(name)
    if rm is None or rm.home not in rm.models:
        return None
    return export_sharded(rm.models[rm.home], Path(out) / name, tok)
