"""How many cores this process may use, and how many torch threads each rank of a run gets.

Pure Python (no torch): the planner prices a rank's compute with the same thread count the runtime
gives it (meshrl/plan/hardware.py), and the launcher sets it in every rank before any torch work.

The rule (``train.threads``, 0 = auto):

- an explicit ``train.threads = N`` gives every rank N threads;
- auto: ``$OMP_NUM_THREADS`` if it is set (the user's, or torchrun's, which sets 1 when it starts
  several processes per node and the variable is unset); else the usable cores split between the
  ranks that share this machine: ``max(1, usable_cores() // local_ranks)``.

Threads that wait sleep (``OMP_WAIT_POLICY=PASSIVE``, unless the user set another policy): with
the default policy a thread waiting at the end of a parallel region spins, and where other
processes share the cores its partner is often descheduled, so it spins for its whole time slice
(``bench/threads_wait.py`` measures the difference; docs/runtime.md "Threads per rank" has its
figures). The variable is read
when torch loads its OpenMP runtime, so ``meshrl``'s command sets it first thing, and the launcher
puts it in every rank's environment.

Usable cores are the affinity mask (``os.sched_getaffinity``: containers and ``taskset`` narrow
it, ``os.cpu_count()`` does not see that) capped by a cgroup CPU quota where one is set (a
container limited to 2 CPUs on a 64-core host may run on all 64 cores but only for 2 of them).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

# cgroup v2 (one file, "QUOTA PERIOD" or "max PERIOD"), then v1 (two files, quota -1 = none)
CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def cgroup_cpu_limit(v2: Path = CGROUP_V2, v1: tuple[Path, Path] = CGROUP_V1) -> float | None:
    """CPUs the cgroup's quota allows (quota / period), or None without a quota."""
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if v1[0].is_file() and v1[1].is_file():
            quota_us, period_us = int(v1[0].read_text()), int(v1[1].read_text())
            return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):  # unreadable or odd: no limit known
        return None
    return None


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, capped by a cgroup CPU quota (rounded up:
    a quota of 1.5 CPUs keeps two threads busy part of the time)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


WAIT_POLICY = "PASSIVE"


def quiet_waits(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set OMP_WAIT_POLICY=PASSIVE in ``env`` (default: this process's) unless it is set; return
    {"OMP_WAIT_POLICY": the value} for a child's environment."""
    target = os.environ if env is None else env
    target.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    return {"OMP_WAIT_POLICY": target["OMP_WAIT_POLICY"]}


def env_threads(env: dict[str, str] | None = None) -> int | None:
    """$OMP_NUM_THREADS as a positive whole number, or None where it is unset, empty or not one."""
    raw = (os.environ if env is None else env).get("OMP_NUM_THREADS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def rank_threads(setting: int, local_ranks: int, env: dict[str, str] | None = None,
                 cores: int | None = None) -> tuple[int, str]:
    """(torch threads per rank, why) for ``train.threads = setting`` (0: auto) and ``local_ranks``
    ranks on this machine; ``why`` is the startup line's explanation."""
    if setting > 0:
        return setting, "train.threads"
    omp = env_threads(env)
    if omp is not None:
        return omp, "auto: $OMP_NUM_THREADS"
    cores = usable_cores() if cores is None else cores
    n = max(1, local_ranks)
    why = f"auto: {cores} usable core{'s' if cores != 1 else ''} / {n} local rank{'s' if n != 1 else ''}"
    return max(1, cores // n), why
