"""The rank pool: real gloo ranks, results in rank order, failures named, hangs bounded."""

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from meshrl.errors import UserError
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


def _echo(*args, **kwargs):
    return args, kwargs


def test_an_unpicklable_task_fails_at_once_naming_the_culprit():
    """A lambda argument used to sit in the queue's feeder thread (error printed there) while the
    pool waited for the whole timeout; now run() refuses it at once and the pool stays usable."""
    with RankPool(2, timeout=60) as pool:
        t0 = time.monotonic()
        with pytest.raises(UserError, match=r"RankPool.run\(_echo\): argument 1 cannot be sent to the ranks"):
            pool.run(_echo, 1, lambda x: x)
        with pytest.raises(UserError, match=r"keyword argument 'lock' cannot be sent"):
            pool.run(_echo, lock=threading.Lock())
        with pytest.raises(UserError, match=r"RankPool.run\(.*<lambda>\): the function cannot be sent"):
            pool.run(lambda: 0)
        assert time.monotonic() - t0 < 5
        got = pool.run(_echo, 2, k=torch.ones(2))
        assert [(a, kw["k"].tolist()) for a, kw in got] == [((2,), [1.0, 1.0])] * 2


def test_hang_is_bounded():
    pool = RankPool(2)
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"rank\(s\) \[0\] did not finish"):
        pool.run(_hang_on_rank0, timeout=3)
    assert time.monotonic() - t0 < 30


def _job_groups(keys: list[tuple[int, ...]], placement: str, reduce_on: tuple[int, ...]) -> float | None:
    """One 'job' as rank_main starts it: make the plan's groups, build a placement's groups, then
    all-reduce on one group (within a short deadline)."""
    from meshrl.layout.mesh import Placement
    from meshrl.runtime.run import make_groups, process_cache

    cache = process_cache(20)
    make_groups(cache, keys)
    cache.for_placement(Placement.parse(placement))
    if dist.get_rank() not in reduce_on:
        return None
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=cache._groups[reduce_on])
    return t.item()


def _stray_group_then_job() -> None:
    """Rank 2 alone makes a group it is not in (returns at once, advancing only its own count)."""
    from meshrl.runtime.run import make_groups, process_cache

    if dist.get_rank() == 2:
        dist.new_group([0, 1])
    make_groups(process_cache(20), [(1, 2)])


def test_a_second_job_in_the_same_ranks_makes_its_groups():
    """The bug that hung a second plan in one pool: after a pp4 job (tied-embedding group (0, 3)),
    ranks 1 and 2 had made one group more than ranks 0 and 3, so the next job's group (2, 3) got
    two names and never formed. Each job's groups now form, and the counts are checked."""
    with RankPool(4, timeout=60) as pool:
        assert pool.run(_job_groups, [(0, 1, 2, 3), (0, 3)], "dp1tp1pp4@0-3", (0, 3)) == [2.0, None, None, 2.0]
        assert pool.run(_job_groups, [(2, 3)], "dp1tp1pp2@2-3", (2, 3)) == [None, None, 2.0, 2.0]
        # a group made by some ranks only is an error naming the counts, not a hang
        with pytest.raises(RankError, match=r"different numbers of process groups \(by rank: \[\d+, \d+, \d+, \d+\]\)"):
            pool.run(_stray_group_then_job)


def _groups_freed_by_end_world() -> list[str]:
    import weakref

    from torch.distributed import distributed_c10d as c10d

    from meshrl.runtime.run import end_world, make_groups, process_cache

    make_groups(process_cache(60.0), [(0, 1)])  # the cache meshrl keeps for the process's life
    refs = {str(c10d._world.pg_names[g]): weakref.ref(g) for g in c10d._world.pg_map}
    end_world()
    return sorted(name for name, ref in refs.items() if ref() is not None)


def test_end_world_frees_every_process_group():
    """A gloo group still alive when a rank exits is freed with its threads unjoined and the rank
    aborts after its job has finished (a torchrun rank's SIGABRT); end_world leaves none alive."""
    with RankPool(2) as pool:
        assert pool.run(_groups_freed_by_end_world) == [[], []]
