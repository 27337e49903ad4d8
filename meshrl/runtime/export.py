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

from ..model.hf_save import INDEX_NAME, WEIGHTS_NAME, hf_config_dict, save_safetensors
from ..model.transformer import CausalLM, ValueModel
from ..parallel import comm
from ..parallel.model import ParallelModel, gather_tensors


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
    writer = g.tp.ranks[0]
    names = [name for name, s in where.items() if s == stage]
    out = gather_tensors(sm, names, set(g.tp.ranks), writer, g, g.tp.group, pm.local_state(), timeout, to_host=True)
    first = me == pm.placement.mesh.ranks[0]
    if first:
        path.mkdir(parents=True, exist_ok=True)
        for stale in [path / WEIGHTS_NAME, path / INDEX_NAME, *path.glob("model-*-of-*.safetensors")]:
            stale.unlink(missing_ok=True)  # never a mix of old and new weights
    if g.mp.group is not None:  # the directory exists before anyone writes into it
        comm.barrier(comm.control(g.mp.group), timeout)
    if me == writer:
        save_safetensors(out, path / _file(stage, pp), {"format": "pt"})
    if first:
        with torch.device("meta"):
            meta = (ValueModel if pm.value_head else CausalLM)(pm.cfg).to(pm.dtype)
        (path / "config.json").write_text(json.dumps(hf_config_dict(meta), indent=2) + "\n")
        if pp > 1:
            size = sum(torch.Size(sm.shapes[n]).numel() for n in where) * torch.empty((), dtype=pm.dtype).element_size()
            index = {"metadata": {"total_size": size}, "weight_map": {n: _file(s, pp) for n, s in where.items()}}
            (path / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        if tok is not None and hasattr(tok, "save_pretrained"):
            tok.save_pretrained(str(path))
    if g.mp.group is not None:  # every stage's file is written when the first rank returns
        comm.barrier(comm.control(g.mp.group), timeout)
    return path if first else None
