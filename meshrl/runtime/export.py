"""The trained model as a Hugging Face checkpoint, written shard by shard by the ranks holding it.

Data-parallel replica 0 takes part. Pipeline stage s writes ``model-0000{s+1}-of-0000{pp}.safetensors``
(``model.safetensors`` when pp = 1) from its writer, the stage's first tensor-parallel rank: each
tensor of the stage is assembled there from the distinct slices its tp ranks hold (one tensor at a
time, sent on the data plane), so no rank ever holds more than its stage plus one tensor. The mesh's
first rank writes ``config.json``, the index and the tokenizer. A tied embedding held by the first
and the last stage is written once, by the first (HF omits the tied ``lm_head``).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch

from ..model.checkpoint import INDEX_NAME, WEIGHTS_NAME, _hf_config, _save_file
from ..model.transformer import CausalLM, ValueModel
from ..parallel import comm
from ..parallel.model import ParallelModel


def _file(stage: int, pp: int) -> str:
    return WEIGHTS_NAME if pp == 1 else f"model-{stage + 1:05d}-of-{pp:05d}.safetensors"


def stage_names(pm: ParallelModel) -> dict[str, int]:
    """HF name -> the pipeline stage whose file holds it (its first stage; tied lm_head left out)."""
    out: dict[str, int] = {}
    for name in pm.sm.shapes:
        for r, _ in pm.sm.holders(name):
            out.setdefault(name, pm.placement.coords_of(r)[2])
    return out


def export_sharded(pm: ParallelModel, path: str | Path, tok=None, timeout_s: float = 300.0) -> Path | None:
    """Collective over replica 0 of ``pm``'s mesh; returns ``path`` on the mesh's first rank."""
    g, sm, me = pm.groups, pm.sm, pm.groups.rank
    if g.dp.index != 0:
        return None
    timeout = datetime.timedelta(seconds=timeout_s)
    path = Path(path)
    pp, stage = pm.placement.layout.pp, g.pp.index
    where = stage_names(pm)
    local = pm.local_state()
    writer = g.tp.ranks[0]
    out: dict[str, torch.Tensor] = {}
    pending = []
    for name, s in where.items():
        if s != stage:
            continue
        holders = [(r, sl) for r, sl in sm.holders(name) if r in g.tp.ranks]
        full = torch.empty(sm.shapes[name], dtype=pm.dtype, device=pm.stage.device) if me == writer else None
        seen: set = set()
        for r, sl in holders:
            if sl in seen:
                continue
            seen.add(sl)
            idx = tuple(slice(a, b) for a, b in sl)
            if r == me == writer:
                full[idx] = local[name]
            elif me == writer:
                buf = torch.empty(tuple(b - a for a, b in sl), dtype=full.dtype, device=full.device)
                comm.irecv(buf, r, g.tp.group).wait(timeout)
                full[idx] = buf
            elif r == me:
                t = local[name].contiguous()
                pending.append((comm.isend(t, writer, g.tp.group), t))
        if full is not None:
            out[name] = full.cpu()
    for work, _ in pending:
        work.wait(timeout)
    first = me == pm.placement.mesh.ranks[0]
    if first:
        path.mkdir(parents=True, exist_ok=True)
        for stale in [path / WEIGHTS_NAME, path / INDEX_NAME, *path.glob("model-*-of-*.safetensors")]:
            stale.unlink(missing_ok=True)  # never a mix of old and new weights
    if g.mp.group is not None:  # the directory exists before anyone writes into it
        comm.barrier(comm.control(g.mp.group), timeout)
    if me == writer:
        _save_file(out, path / _file(stage, pp), {"format": "pt"})
    if first:
        with torch.device("meta"):
            meta = (ValueModel if pm.value_head else CausalLM)(pm.cfg).to(pm.dtype)
        (path / "config.json").write_text(json.dumps(_hf_config(meta), indent=2) + "\n")
        if pp > 1:
            size = sum(torch.Size(sm.shapes[n]).numel() for n in where) * torch.empty((), dtype=pm.dtype).element_size()
            index = {"metadata": {"total_size": size}, "weight_map": {n: _file(s, pp) for n, s in where.items()}}
            (path / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        if tok is not None and hasattr(tok, "save_pretrained"):
            tok.save_pretrained(str(path))
    if g.mp.group is not None:  # every stage's file is written when the first rank returns
        comm.barrier(comm.control(g.mp.group), timeout)
    return path if first else None
