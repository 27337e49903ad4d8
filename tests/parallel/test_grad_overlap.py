"""The dp gradient all-reduce overlapped with the backward (meshrl/parallel/overlap.py), on 4 real
gloo ranks: the same gradients, loss and gradient norm as the reduction after the backward
(parallel/data.py all_reduce_grads), within summation-order tolerance; and the buckets really start
inside the backward pass (autograd's graph task is running when the collective is issued), during
the last micro-batch only, in the same order on every rank."""

import pytest
import torch

from meshrl.layout.mesh import Placement
from meshrl.model.presets import get_preset
from meshrl.parallel import comm
from meshrl.parallel.data import AdamWConfig
from meshrl.parallel.groups import GroupCache
from meshrl.parallel.load import InitLoader
from meshrl.parallel.model import ParallelModel
from meshrl.runtime.launch import RankPool

LAYOUTS = [("dp4tp1pp1@0-3", False, 2), ("dp2tp1pp2@0-3", True, 3), ("dp2tp2pp1@0-3", False, 1)]


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, timeout=120) as p:
        yield p


def _batch(dp_i: int, dp: int) -> dict[str, torch.Tensor]:
    """Replica dp_i's rows of one mini-batch of 8 sequences (left padding on some rows)."""
    ids = torch.randint(1, 250, (8, 12), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[6, :2] = 0
    rows = slice(dp_i * 8 // dp, (dp_i + 1) * 8 // dp)
    return {"input_ids": ids[rows], "attention_mask": mask[rows]}


def _loss(out, mb):  # normalised by the whole mini-batch's token count (8 x 11 at most)
    return -(out.logprobs * mb["attention_mask"][:, 1:]).sum() / 80.0


def _run(layout: str, tied: bool, micro: int) -> dict:
    cfg = get_preset("tiny").replace(tie_word_embeddings=tied, num_hidden_layers=4)
    cache = GroupCache(timeout_s=60)
    placement = Placement.parse(layout)
    out: dict = {}
    for overlap in (False, True):
        pm = ParallelModel.create(cfg, placement, cache, InitLoader(cfg, 3), optim=AdamWConfig(lr=1e-2),
                                  grad_bucket_bytes=64 << 10, overlap_grad_reduce=overlap)
        launches: list[bool] = []  # per dp all-reduce: issued inside a running backward?
        real = comm.all_reduce

        def spy(t, group, *a, _real=real, _dp=pm.groups.dp.group, _log=launches, **kw):
            if group is _dp:
                _log.append(torch._C._current_graph_task_id() != -1)
            return _real(t, group, *a, **kw)

        comm.all_reduce = spy
        try:
            loss = pm.forward_backward(_batch(pm.groups.dp.index, pm.placement.layout.dp), _loss, micro)
        finally:
            comm.all_reduce = real
        grads = {n: g.clone() for n, g in pm.local_grads().items()}
        norm = pm.optimizer_step()
        out[overlap] = {"loss": loss, "grads": grads, "norm": norm, "launches": launches,
                        "buckets": None if pm._grad_buckets is None else len(pm._grad_buckets.buckets),
                        "in_backward": None if pm._grad_buckets is None else pm._grad_buckets.launched_in_backward}
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout,tied,micro", LAYOUTS)
def test_overlapped_reduction_equals_the_plain_one(pool, layout, tied, micro):
    for r in pool.run(_run, layout, tied, micro):
        plain, over = r[False], r[True]
        assert over["loss"] == pytest.approx(plain["loss"], rel=1e-6)
        assert over["norm"] == pytest.approx(plain["norm"], rel=1e-5)
        assert set(over["grads"]) == set(plain["grads"])
        for n, g in plain["grads"].items():
            torch.testing.assert_close(over["grads"][n], g, rtol=1e-5, atol=1e-7, msg=n)
        # the plain path reduces after the backward; the overlapped one inside it, bucket by bucket
        assert plain["launches"] and not any(plain["launches"])
        assert over["buckets"] >= 2 and len(over["launches"]) == over["buckets"]
        assert over["in_backward"] == over["buckets"] and all(over["launches"]), over["launches"]
