"""Ranks started by meshrl's launcher get their share of the usable cores (meshrl/cores.py)
unless $OMP_NUM_THREADS says otherwise, set before the rank does any torch work."""

import os

import torch

from meshrl.cores import usable_cores
from meshrl.runtime.launch import RankPool


def _threads() -> tuple[int, str | None]:
    return torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY")


def test_ranks_split_the_usable_cores_without_omp_num_threads(monkeypatch):
    """... and their waiting threads sleep (OMP_WAIT_POLICY=PASSIVE, meshrl/cores.py)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # tests/conftest.py sets it; a user may not
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with RankPool(2, timeout=60) as pool:
        assert pool.run(_threads) == [(max(1, usable_cores() // 2), "PASSIVE")] * 2
