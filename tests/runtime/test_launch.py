"""The rank pool: real gloo ranks, results in rank order, failures named, hangs bounded."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from meshrl.runtime.launch import RankError, RankPool


def _allreduce_rank() -> float:
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


def _fail_on_rank1() -> int:
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    return dist.get_rank()


def _hang_on_rank0() -> int:
    if dist.get_rank() == 0:
        time.sleep(60)
    return 0


def _pid() -> int:
    return os.getpid()


def test_pool_runs_collectives_and_reports_in_rank_order():
    with RankPool(3) as pool:
        assert pool.run(_allreduce_rank) == [3.0, 3.0, 3.0]
        assert pool.run(_allreduce_rank) == [3.0, 3.0, 3.0]  # reusable across calls


def test_failure_names_the_rank_and_leaves_no_process():
    pool = RankPool(2)
    pids = pool.run(_pid)
    with pytest.raises(RankError, match="rank 1 failed"):
        pool.run(_fail_on_rank1)
    for pid in pids:
        with pytest.raises(OSError):
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)


def test_hang_is_bounded():
    pool = RankPool(2)
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"rank\(s\) \[0\] did not finish"):
        pool.run(_hang_on_rank0, timeout=3)
    assert time.monotonic() - t0 < 30
