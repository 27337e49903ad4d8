"""Run a plan on this machine's CPU ranks for a few iterations and return the runtime's metrics
records, for ``meshrl plan --validate`` (meshrl/plan/validate.py compares them with the prediction).

It is the code path of ``meshrl train --nprocs N --plan FILE.json`` (the same RankPool of gloo ranks
and the same ``rank_main``), with two differences that keep the measurement to what the planner
models: nothing is written to disk (no checkpoints, metrics file or trace between iterations), and
the actor starts from the preset's initial weights without the demo's SFT warm-up, so that
generation runs to ``data.gen_len`` tokens as the estimator assumes (a warmed-up actor stops at
EOS after two or three tokens).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from ..config import Config
from ..errors import UserError
from ..plan.execution_plan import ExecutionPlan
from .launch import RankError, RankPool, failure_report
from .plans import check_plan
from .run import rank_main

JOB_DEADLINE_S = 3600.0  # the whole validation run; a hung collective ends sooner, at timeout_s


def run_plan(cfg: Config, plan: ExecutionPlan, iterations: int, max_ranks: int, timeout_s: float = 300.0
             ) -> list[dict]:
    """The metrics records (one per iteration) of ``plan`` run for ``iterations`` iterations on
    ``plan.cluster.size`` local gloo ranks. UserError if that is more than ``max_ranks``;
    RuntimeError naming the rank and the step if a rank fails."""
    world = plan.cluster.size
    if world > max_ranks:
        raise UserError(f"--validate: the plan needs {world} ranks (cluster.nodes x cluster.devices_per_node), "
                        f"more than the {max_ranks} local ranks allowed (--max-ranks)")
    if iterations < 2:
        raise UserError(f"--validate-iterations must be >= 2 (iteration 0 is a warm-up), got {iterations}")
    cfg = copy.deepcopy(cfg)
    cfg.train.iterations = iterations
    cfg.sft.warmup = False
    check_plan(cfg, plan)
    with tempfile.TemporaryDirectory(prefix="meshrl-validate-") as tmp:
        try:
            # MESHRL_MEASURE_MEM: each call's peak memory in iteration 0 (runtime/memory.py)
            with RankPool(world, backend="gloo", timeout=timeout_s, env={"MESHRL_MEASURE_MEM": "1"}) as pool:
                return pool.run(rank_main, cfg, plan, None, start=0, timeout_s=timeout_s, status_dir=tmp,
                                quiet=True, timeout=JOB_DEADLINE_S)[0]
        except RankError as e:
            raise RuntimeError(failure_report(Path(tmp), e)) from None
