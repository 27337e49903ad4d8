"""What the planner prices when the config asks for ``cluster.device=cpu`` and this machine has no
measured profile yet: one behaviour for ``meshrl plan`` and ``meshrl train --nprocs/--plan``.

``cpu`` is not a preset: every CPU cost is measured by ``meshrl profile``. Without a profile the
plan's *shape* is chosen with the ``a100-80g`` preset's costs as a stand-in (the strategies'
structure does not depend on the device for models this small), and the command says so, with
how to get real numbers. A profile named explicitly (``--profile FILE``) must exist.

The stand-in prices time only. Memory is the run's own: weights, gradients and activations in the
dtype the run takes on this CPU (``train.dtype=auto``: float32 without bf16 dot products, where a
GPU would take bf16), held as the runtime's CPU code paths hold them (``Hardware.cpu``), so that
``meshrl plan --dry-run`` compares a prediction of what it executes; and each rank has its share of
this machine's RAM, as a profile would give it, not the GPU's 80 GB.
"""

from __future__ import annotations

import copy
import dataclasses

from ..cpu_features import auto_dtype
from ..host_memory import physical_bytes
from .hardware_profile import profile_path
from .problem import Problem, problem_from_config

STAND_IN_DEVICE = "a100-80g"


def planning_config(cfg, profile: str | None = None):
    """(the config the planner prices, a note for the user or ""). The note is empty unless the
    stand-in replaces ``cpu``; then the config names the stand-in device and the run's own dtype."""
    if cfg.cluster.device != "cpu" or profile is not None or profile_path().is_file():
        return cfg, ""
    pcfg = copy.deepcopy(cfg)
    pcfg.cluster.device = STAND_IN_DEVICE
    if pcfg.train.dtype == "auto":  # as the runtime resolves it on this CPU, not on the stand-in GPU
        pcfg.train.dtype = auto_dtype(gpu=False)
    note = (f"note: no CPU profile ({profile_path()}): the plan's shape is chosen with {STAND_IN_DEVICE} costs, "
            "so its times are not this machine's; run `meshrl profile` (about 3 minutes) for measured ones")
    return pcfg, note


def planning_problem(cfg, profile: str | None = None) -> tuple[Problem, str]:
    """(the planning problem of ``cfg``, the stand-in's note or ""): ``problem_from_config`` of
    ``planning_config``'s config, whose hardware, under the stand-in, prices memory as the CPU
    code paths hold it, against each rank's share of this machine's RAM."""
    pcfg, note = planning_config(cfg, profile)
    problem = problem_from_config(pcfg, profile)
    if note:  # the stand-in replaced cpu
        problem.hw = dataclasses.replace(problem.hw, cpu=True,
                                         mem_bytes=physical_bytes() / cfg.cluster.devices_per_node)
    return problem, note
