"""A TrainerCallback that times each optimizer step (wall and CPU seconds), for the TRL sides of the
GRPO benches (bench/grpo_trl_side.py, bench/grpo_smollm2_trl_side.py). Imported in TRL's own venv."""

from __future__ import annotations

import time

from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """``seconds`` and ``cpu``: one entry per step, wall (perf_counter) and process CPU time."""

    def __init__(self):
        self.seconds, self.cpu, self.t0, self.c0 = [], [], 0.0, 0.0

    def on_step_begin(self, *a, **k):
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, *a, **k):
        self.seconds.append(time.perf_counter() - self.t0)
        self.cpu.append(time.process_time() - self.c0)
