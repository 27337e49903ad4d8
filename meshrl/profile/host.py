"""Host time between calls, for ``meshrl profile`` (and ``--gpu``): what the runtime spends per call
outside every step the estimator prices (dispatching a step, splitting and joining batches,
reward rules on the host, statistics, the iteration's bookkeeping).

Measured by running the runtime itself (``rank_main``, one rank, in this process, no output
directory, so no checkpoint or metrics file is written) on the tiny preset for a few iterations:
per iteration, host time = wall time - the sum of the step times the engine recorded
(``time/call/*``, ``time/realloc/*``, ``time/transfer/*``); ``call_host_s`` is the median over the
iterations after the first (warm-up) divided by the calls in an iteration. The simulator adds it to
every call (meshrl/plan/estimator.py ``estimate_call``).
"""

from __future__ import annotations

import statistics
from ..config import Config, with_algo_defaults
from ..runtime.job import in_process
from ..runtime.plans import resolve_plan

ITERATIONS = 6  # --quick: 3
STEP_PREFIXES = ("time/call/", "time/realloc/", "time/transfer/")


def host_gap(records: list[dict]) -> dict:
    """{call_host_s, calls, iterations}: see the module docstring. ``records``: one per iteration."""
    rec = records[1:] if len(records) > 1 else records
    calls = max(1, max(sum(1 for k in r if k.startswith("time/call/")) for r in rec))
    gaps = [max(0.0, r["time/iteration"] - sum(v for k, v in r.items() if k.startswith(STEP_PREFIXES)))
            for r in rec]
    return {"call_host_s": statistics.median(gaps) / calls, "calls": calls, "iterations": len(rec)}


def measure_host_gap(quick: bool = False, timeout_s: float = 120.0) -> dict:
    """Run the one-rank runtime on the tiny preset (PPO: six calls) and return ``host_gap``."""

    cfg = with_algo_defaults(Config())  # the built-in demo (PPO, tiny models, a rule reward)
    cfg.data.batch_size, cfg.data.gen_len, cfg.sft.steps = 8, 8, 1
    cfg.train.iterations = 3 if quick else ITERATIONS
    cfg.train.threads = 1  # the profile's convention: one thread (threads.py measures more)
    plan, _ = resolve_plan(cfg, "colocated", 1)
    records = in_process(cfg, plan, None, 0, timeout_s, None, quiet=True, progress=False)
    return host_gap(records)
