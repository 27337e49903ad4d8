"""How this machine's cores are shared between ranks, for ``meshrl profile``.

- ``cores``: the cores this process may run on (``os.sched_getaffinity``), not ``os.cpu_count()``:
  a container or ``taskset`` limits the first, not the second;
- ``threads_per_rank``: ``torch.get_num_threads()`` inside the ranks measured, always 1 (the
  curve is for one-thread ranks; threads.py measures what more threads per rank give, and
  the planner combines the two: meshrl/plan/hardware_profile.py ``from_profile``);
- ``contention``: the measured slowdown of k ranks computing at once. k ranks of a RankPool wait on
  one gloo barrier, then each repeats one forward + backward of meshrl's tiny model until a common
  deadline; a rank's seconds per step are the window up to its last step that ended inside it, over
  the steps (so every counted step ran while all k were busy). slowdown(k) = the median rank's
  seconds per step / the seconds per step of one rank alone, measured right before and after (the
  mean of the two), so that drift of the machine's speed between the two cancels; the curve is the
  median over ROUNDS such passes over every k (other tenants' bursts hit one pass, not three).

The simulator (meshrl/plan/simulator.py) stretches steps that run at the same time on one host by
this curve; nothing in it is assumed but processor sharing beyond the largest k measured.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ..cores import usable_cores
from ..runtime.launch import RankPool
from ..model.generation import sequence_logprobs
from ..model.presets import get_preset
from ..model.checkpoint import build_model

WORK = (4, 32)  # sequences x tokens per step of the tiny model: ~30 ms of forward + backward alone
ROUNDS = 3  # passes over every k; the curve takes the median (--quick: one)
MAX_RANKS = 8  # the largest k measured; beyond it the simulator assumes processor sharing
_state: dict = {}


def contention_ranks(cores: int, quick: bool) -> tuple[int, ...]:
    """The k measured besides 1: 2, 3, 4 and the points around the core count, up to MAX_RANKS."""
    if quick:
        return (2,)
    return tuple(sorted(k for k in {2, 3, 4, cores, cores + 1, 2 * cores} if 2 <= k <= MAX_RANKS))


def _setup() -> int:
    """On every rank: build the step (tiny model, fixed seed), run it twice; return the threads."""

    torch.manual_seed(0)
    model = build_model(get_preset("tiny"))
    ids = torch.randint(1, 200, WORK)

    def step() -> None:
        (-sequence_logprobs(model, ids).mean()).backward()
        model.zero_grad(set_to_none=True)

    step()
    step()
    _state["step"] = step
    return torch.get_num_threads()


def _busy(k: int, seconds: float) -> float | None:
    """On every rank: ranks below k repeat the step for ``seconds`` after a common barrier and
    return seconds per step; the others return None at once (they wait, idle, for the next task)."""
    dist.barrier()
    if dist.get_rank() >= k:
        return None
    step = _state["step"]
    t0 = time.perf_counter()
    last, n = t0, 0
    while True:
        step()
        t = time.perf_counter()
        if t > t0 + seconds:
            break
        last, n = t, n + 1
    return (last - t0) / n if n else t - t0  # n == 0: one step outlasted the window


def measure_cores(quick: bool, timeout_s: float = 120.0) -> dict:
    """{cores, threads_per_rank, contention: {work, seconds_per_step_alone, slowdown: {k: factor}}}."""
    cores = usable_cores()
    ks = contention_ranks(cores, quick)
    window = 0.3 if quick else 1.0
    rounds: dict[int, list[float]] = {k: [] for k in ks}
    with RankPool(max(ks), backend="gloo", timeout=timeout_s, start_timeout=timeout_s,
                  env={"OMP_NUM_THREADS": "1"}) as pool:
        threads = pool.run(_setup)[0]
        alone = [pool.run(_busy, 1, window)[0]]
        for _ in range(1 if quick else ROUNDS):
            for k in ks:
                times = [t for t in pool.run(_busy, k, window) if t is not None]
                alone.append(pool.run(_busy, 1, window)[0])
                rounds[k].append(statistics.median(times) / ((alone[-2] + alone[-1]) / 2))
    slowdown = {"1": 1.0, **{str(k): statistics.median(v) for k, v in rounds.items()}}
    return {"cores": cores, "threads_per_rank": threads,
            "contention": {"work": f"tiny model forward + backward on {WORK[0]} x {WORK[1]} tokens per rank",
                           "window_s": window, "seconds_per_step_alone": statistics.median(alone),
                           "slowdown": slowdown, "rounds": {str(k): v for k, v in rounds.items()}}}
