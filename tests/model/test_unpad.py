"""Padding-free projections (transformer.Unpad) and the compiled engine's shape buckets.

A padded batch's real tokens go through every matmul packed, attention back in the padded layout:
the real tokens' logits and every gradient must equal the padded execution's (the oracle: the same
model with Unpad switched off, which transformers parity tests pin to transformers)."""

from __future__ import annotations

import pytest
import torch

import meshrl.model.transformer as tr
from meshrl.model import build_model
from meshrl.model.generation import cache_length, compaction_keep


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """[4, 12] ids with left padding, right padding, both, and none."""
    ids = torch.randint(3, 250, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, :5] = 0
    mask[1, 9:] = 0
    mask[2, :2] = 0
    mask[2, 10:] = 0
    return ids, mask


def _run(model, ids, mask, unpad: bool, monkeypatch) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """-> (logits [B, S, V], gradients by name, how many times Unpad.of packed the batch)."""
    packed = []
    real_of = tr.Unpad.of

    def of(tokens):
        u = real_of(tokens) if unpad else None
        packed.append(u is not None)
        return u

    monkeypatch.setattr(tr.Unpad, "of", staticmethod(of))
    model.zero_grad(set_to_none=True)
    logits = model(ids, mask)
    (logits.float().log_softmax(-1)[..., 7] * mask).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, sum(packed)


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_unpadded_equals_padded(preset, monkeypatch):
    model = build_model(preset, seed=3)
    ids, mask = _batch()
    a, ga, n_packed = _run(model, ids, mask, True, monkeypatch)
    b, gb, _ = _run(model, ids, mask, False, monkeypatch)
    assert n_packed == 1  # the padded batch was packed (and the oracle run was not)
    real = mask.bool()
    assert (a[real] - b[real]).abs().max() <= 1e-5
    # An expert that only pad tokens reach has a gradient of zeros on one side and none on the other.
    for name in ga.keys() | gb.keys():
        want = gb.get(name, torch.zeros(()))
        got = ga.get(name, torch.zeros(()))
        scale = want.abs().max().clamp(min=1e-6)
        assert ((got - want).abs().max() / scale) <= 1e-4, name


def test_unpad_packs_only_padded_batches():
    assert tr.Unpad.of(torch.ones(3, 5, dtype=torch.long)) is None  # nothing to skip
    assert tr.Unpad.of(torch.tensor([[0], [1]])) is None  # one position (a decode step)
    u = tr.Unpad.of(torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert u.idx.tolist() == [1, 2, 3, 4]
    x = torch.arange(6.0).view(2, 3, 1)
    assert u.pack(x).flatten().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert u.unpack(u.pack(x)).flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]


def test_compiled_shapes_come_from_few_buckets():
    assert [cache_length(n, False) for n in (1, 33, 96)] == [1, 33, 96]  # eager: exact
    assert [cache_length(n, True) for n in (1, 32, 33, 96)] == [32, 32, 64, 96]
    alive = torch.tensor([True, False, True, False, False, True, False, False, False, False])
    assert compaction_keep(alive, False).tolist() == [0, 2, 5]
    keep = compaction_keep(alive, True)  # 3 live rows -> a batch of 4: the live ones and one ended
    assert keep.tolist() == [0, 2, 5, 1]
    assert compaction_keep(torch.tensor([True, True, True, False]), True).tolist() == [0, 1, 2, 3]
