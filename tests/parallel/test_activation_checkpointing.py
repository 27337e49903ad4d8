"""``train.activation_checkpointing`` on 2 real gloo ranks (tp2, so the recomputed layers repeat
their all-reduces): gradients equal those without it, bit for bit, in fp32 and bf16, while the
tensors saved for the backward shrink (counted with saved_tensors_hooks)."""

import pytest
import torch

from meshrl.layout.mesh import Placement
from meshrl.model.checkpoint import build_model
from meshrl.parallel.groups import GroupCache
from meshrl.parallel.load import InitLoader
from meshrl.parallel.model import ParallelModel
from meshrl.runtime.launch import RankPool


def _loss(out, mb):
    return -(out.logprobs * mb["attention_mask"][:, 1:]).sum() / 100


def _grads(dtype_name: str) -> dict:
    dtype = getattr(torch, dtype_name)
    cfg = build_model("tiny").config
    cache = GroupCache(timeout_s=60)
    ids = torch.randint(1, 250, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:2, :3] = 0  # left padding: the masked path
    out = {}
    for ckpt in (False, True):
        pm = ParallelModel.create(cfg, Placement.parse("dp1tp2pp1@0-1"), cache, InitLoader("tiny", 3, dtype=dtype),
                                  activation_checkpointing=ckpt)
        saved = [0]

        def pack(t, saved=saved):
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            pm.forward_backward({"input_ids": ids, "attention_mask": mask}, _loss, micro_batches=2)
        out[ckpt] = ({n: g.clone() for n, g in pm.local_grads().items()}, saved[0])
    return {"equal": all(torch.equal(out[False][0][n], out[True][0][n]) for n in out[False][0]),
            "saved": (out[False][1], out[True][1])}


@pytest.mark.timeout(240)
def test_checkpointed_gradients_equal_and_save_less():
    with RankPool(2, timeout=120) as pool:
        outs = pool.run(_grads, "float32") + pool.run(_grads, "bfloat16")
    for r in outs:
        assert r["equal"], r
        plain, ckpt = r["saved"]
        assert ckpt < plain / 2, r  # only the layers' inputs (and the head) stay saved
