"""meshrl/cores.py: the usable cores (affinity mask capped by a cgroup quota) and the torch
threads each rank gets (train.threads, $OMP_NUM_THREADS, or the cores split between local ranks)."""

import math
import os

from meshrl.cores import cgroup_cpu_limit, env_threads, quiet_waits, rank_threads, usable_cores


def test_cgroup_quota_v2_and_v1(tmp_path):
    v2 = tmp_path / "cpu.max"
    v1 = (tmp_path / "quota", tmp_path / "period")
    none = (tmp_path / "absent1", tmp_path / "absent2")
    v2.write_text("150000 100000\n")
    assert cgroup_cpu_limit(v2, none) == 1.5
    v2.write_text("max 100000\n")
    assert cgroup_cpu_limit(v2, none) is None
    v1[0].write_text("200000\n")
    v1[1].write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path / "absent", v1) == 2.0
    v1[0].write_text("-1\n")
    assert cgroup_cpu_limit(tmp_path / "absent", v1) is None
    v2.write_text("garbage")
    assert cgroup_cpu_limit(v2, none) is None  # unreadable: no limit known, never an exception


def test_usable_cores_is_the_affinity_mask_capped_by_the_quota():
    want = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit()
    if limit is not None:
        want = min(want, max(1, math.ceil(limit)))
    assert usable_cores() == want >= 1


def test_rank_threads_rule():
    assert rank_threads(3, 4, {}, cores=2) == (3, "train.threads")  # explicit wins, even oversubscribed
    assert rank_threads(0, 1, {"OMP_NUM_THREADS": "4"}, cores=2) == (4, "auto: $OMP_NUM_THREADS")
    assert rank_threads(0, 1, {}, cores=8)[0] == 8  # one rank: every usable core
    assert rank_threads(0, 3, {}, cores=8)[0] == 2  # three ranks share 8 cores: 2 each
    assert rank_threads(0, 4, {}, cores=2)[0] == 1  # more ranks than cores: at least 1
    assert rank_threads(0, 2, {}, cores=2)[1] == "auto: 2 usable cores / 2 local ranks"
    assert [env_threads({"OMP_NUM_THREADS": v}) for v in ("", "0", "x", " 2 ")] == [None, None, None, 2]


def test_waiting_threads_sleep_unless_the_user_chose_a_policy():
    env: dict[str, str] = {}
    assert quiet_waits(env) == {"OMP_WAIT_POLICY": "PASSIVE"} and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert quiet_waits({"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_generate_takes_its_threads_as_train_does(capsys, monkeypatch):
    """`meshrl generate --threads 0` is auto as train.threads: $OMP_NUM_THREADS (tests/conftest.py: 1)
    first. It used to take every usable core and, in a pytest process, left torch on 2 threads for
    every later test: test_generation.py's compaction test then took 25 s instead of 1.2 s."""
    import torch

    from meshrl.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["generate", "--model", "tiny", "--prompt", "3+4=", "--max-new-tokens", "2", "--greedy"]) == 0
    assert torch.get_num_threads() == 1
    try:
        assert main(["generate", "--model", "tiny", "--prompt", "3+4=", "--max-new-tokens", "2", "--greedy",
                     "--threads", "2"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)  # as the rest of the suite expects


def test_a_run_in_this_process_gives_the_threads_back(tmp_path):
    """`meshrl train` on one rank runs in the caller's process with train.threads; the caller's
    thread count comes back afterwards (a library call, or the rest of a test suite)."""
    import torch

    from meshrl.cli import main

    torch.set_num_threads(1)
    assert main(["train", "train.iterations=1", "train.threads=2", "sft.warmup=false", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    assert torch.get_num_threads() == 1
