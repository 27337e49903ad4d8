"""What the planner prices when the config asks for ``cluster.device=cpu`` and this machine has no
measured profile yet: one behaviour for ``meshrl plan`` and ``meshrl train --nprocs/--plan``.

``cpu`` is not a preset: every CPU cost is measured by ``meshrl profile``. Without a profile the
plan's *shape* is chosen with the ``a100-80g`` preset's costs as a stand-in (the strategies'
structure does not depend on the device for models this small), and the command says so, with
how to get real numbers. A profile named explicitly (``--profile FILE``) must exist.
"""

from __future__ import annotations

import copy

from .hardware_profile import profile_path

STAND_IN_DEVICE = "a100-80g"


def planning_config(cfg, profile: str | None = None):
    """(the config the planner prices, a note for the user or ""). The note is empty unless the
    stand-in replaces ``cpu``."""
    if cfg.cluster.device != "cpu" or profile is not None or profile_path().is_file():
        return cfg, ""
    pcfg = copy.deepcopy(cfg)
    pcfg.cluster.device = STAND_IN_DEVICE
    note = (f"note: no CPU profile ({profile_path()}): the plan's shape is chosen with {STAND_IN_DEVICE} costs, "
            "so its times are not this machine's; run `meshrl profile` (about 3 minutes) for measured ones")
    return pcfg, note
