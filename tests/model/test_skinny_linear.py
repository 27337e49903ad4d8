"""transformer.skinny_linear: the (W @ x^T)^T orientation for skinny float32 CPU batches gives
F.linear's numbers, and only where it is chosen (16..48 rows, no autograd, float32 on a CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshrl.model import build_model
from meshrl.model.transformer import SKINNY_ROWS, skinny_linear


def test_skinny_linear_equals_linear_where_chosen():
    g = torch.Generator().manual_seed(0)
    lo, hi = SKINNY_ROWS
    for n, k in ((688, 256), (1376, 896)):
        w = torch.randn(n, k, generator=g)
        for rows in (lo, 32, hi):
            x = torch.randn(rows, 1, k, generator=g)
            with torch.no_grad():
                got = skinny_linear(x, w)
            assert got is not None and got.shape == (rows, 1, n)
            torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4)
    w = torch.randn(64, 32, generator=g)
    with torch.no_grad():
        assert skinny_linear(torch.randn(lo - 1, 32), w) is None  # too few rows
        assert skinny_linear(torch.randn(hi + 1, 32), w) is None  # enough rows for the usual way
        assert skinny_linear(torch.randn(32, 32, dtype=torch.bfloat16), w.bfloat16()) is None
    assert skinny_linear(torch.randn(32, 32), w) is None  # autograd on: training keeps F.linear


def test_mlp_decode_rows_equal_the_plain_mlp(monkeypatch):
    import meshrl.model.transformer as tr

    torch.manual_seed(0)
    mlp = build_model("tiny").model.layers[0].mlp
    x = torch.randn(32, 1, mlp.gate_proj.weight.shape[1])
    with torch.no_grad():
        skinny = mlp(x)
        monkeypatch.setattr(tr, "SKINNY_ROWS", (1, 0))  # never chosen
        plain = mlp(x)
    torch.testing.assert_close(skinny, plain, rtol=1e-5, atol=1e-6)
