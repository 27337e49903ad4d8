"""A rank that never joins makes its peers fail with an error within the deadline, never hang:
a pipeline receive (pp2 on ranks 0-1) and a tensor-parallel all-reduce (tp2 on ranks 2-3), at once;
then micro-batched pipelined generation (two pp2 meshes), a last stage waiting for hidden states
and a first stage waiting for tokens."""

import time

import pytest
import torch
import torch.distributed as dist

from meshrl.model.checkpoint import build_model
from meshrl.parallel.groups import GroupCache
from meshrl.layout.mesh import Placement
from meshrl.parallel.model import ParallelModel
from meshrl.runtime.launch import RankPool


def _peer_never_joins() -> tuple[str, float]:
    model = build_model("tiny", seed=0)
    cache = GroupCache(timeout_s=3)
    pms = [ParallelModel.from_state(model.config, Placement.parse(p), cache, model.state_dict(), timeout_s=3)
           for p in ("dp1tp1pp2@0-1", "dp1tp2pp1@2-3")]  # every rank makes both (collective)
    pm = next(p for p in pms if p is not None)
    if dist.get_rank() in (0, 2):  # the first stage / the first tp rank never runs the forward
        return "idle", 0.0
    ids = torch.zeros(2, 5, dtype=torch.long)
    t0 = time.monotonic()
    try:
        pm.logits(ids, torch.ones_like(ids))
    except RuntimeError as e:
        return f"raised: {str(e)[:80]}", time.monotonic() - t0
    return "returned", time.monotonic() - t0


def _generation_peer_never_joins() -> tuple[str, float]:
    from meshrl.model.generation import GenerationConfig

    model = build_model("tiny", seed=0)
    cache = GroupCache(timeout_s=3)
    pms = [ParallelModel.from_state(model.config, Placement.parse(p), cache, model.state_dict(), timeout_s=3)
           for p in ("dp1tp1pp2@0-1", "dp1tp1pp2@2-3")]
    pm = next(p for p in pms if p is not None)
    if dist.get_rank() in (0, 3):  # the first stage of 0-1 and the last stage of 2-3 never generate
        return "idle", 0.0
    t0 = time.monotonic()
    try:
        pm.generate([[1, 2, 3]] * 4, GenerationConfig(max_new_tokens=4, greedy=True), micro_batches=2)
    except RuntimeError as e:
        return f"raised: {str(e)[:80]}", time.monotonic() - t0
    return "returned", time.monotonic() - t0


@pytest.mark.timeout(180)
def test_a_missing_peer_fails_within_the_deadline():
    with RankPool(4, timeout=120) as pool:
        out = pool.run(_peer_never_joins)
        gen = pool.run(_generation_peer_never_joins)
    for rank in (1, 3):
        status, seconds = out[rank]
        assert status.startswith("raised"), (rank, status)
        assert seconds < 30, (rank, seconds)
    for rank in (1, 2):  # 1: the last stage, waiting for hidden states; 2: the first, for tokens
        status, seconds = gen[rank]
        assert status.startswith("raised"), (rank, status)
        assert seconds < 30, (rank, seconds)
