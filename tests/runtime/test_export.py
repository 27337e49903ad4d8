"""The HF export written shard by shard (meshrl/runtime/export.py) on 4 real gloo ranks, a tp2 pp2
placement (tensor slices and stage files) and dp2 (replica 1 stays out): the checkpoint on disk
loads with load_pretrained and with transformers, equal to the weights the ranks hold, gathered
by an independent path (the InitLoader's seeded init = build_model's)."""

import pytest
import torch

from meshrl.layout.mesh import Placement
from meshrl.model.checkpoint import build_model, load_pretrained
from meshrl.parallel.groups import GroupCache
from meshrl.parallel.load import InitLoader
from meshrl.parallel.model import ParallelModel
from meshrl.runtime.export import export_sharded
from meshrl.runtime.launch import RankPool


def _export(out: str, placement: str, dtype: str, value_head: bool):
    cfg = build_model("tiny").config
    pm = ParallelModel.create(cfg, Placement.parse(placement), GroupCache(timeout_s=60),
                              InitLoader("tiny", 5, value_head=value_head, dtype=getattr(torch, dtype)),
                              value_head=value_head)
    got = export_sharded(pm, out)
    return None if got is None else str(got)


@pytest.mark.timeout(300)
def test_sharded_export_loads_as_the_model(tmp_path):
    with RankPool(4, timeout=120) as pool:
        a = pool.run(_export, str(tmp_path / "a"), "dp1tp2pp2@0-3", "float32", False)
        b = pool.run(_export, str(tmp_path / "b"), "dp2tp2pp1@0-3", "bfloat16", True)
    assert a[0] == str(tmp_path / "a") and a[1:] == [None] * 3
    assert b[0] == str(tmp_path / "b") and b[1:] == [None] * 3
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json"]
    want = build_model("tiny", seed=5).state_dict()
    got = load_pretrained(tmp_path / "a").state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    assert torch.equal(hf.model.layers[3].mlp.down_proj.weight, want["model.layers.3.mlp.down_proj.weight"])
    v = load_pretrained(tmp_path / "b", value_head=True, dtype=torch.bfloat16).state_dict()
    vw = build_model("tiny", seed=5, value_head=True, dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(v[k], vw[k]) for k in vw)
