"""Learning-rate schedules, as a pure function of the optimizer step's global index.

The index of a step is computed from (iteration, epoch, mini-batch), never counted by a process, so
the LR of every step is the same under every plan and after ``--resume`` (a resumed run starts at
iteration k with the index k x steps-per-iteration).

    warmup     lr = base * (s + 1) / W                    for s < W (W = optim.warmup steps)
    constant   lr = base
    linear     lr = base * (m + (1 - m) * (1 - p))        p = (s - W) / max(1, T - W - 1) in [0, 1]
    cosine     lr = base * (m + (1 - m) * (1 + cos(pi p)) / 2)

with T the run's total optimizer steps (the last step reaches base * m) and m = optim.min_lr_ratio. verl and HF's
get_cosine_schedule_with_warmup start the warmup at lr 0 (s / W); here the first step already
moves ((s + 1) / W), so a step is never wasted at lr 0.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, total: int, schedule: str = "constant", warmup: int = 0, min_ratio: float = 0.0
              ) -> float:
    """The multiplier of the base LR at optimizer step ``step`` (0-based) of ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    p = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup - 1)))
    if schedule == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - p)
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown LR schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def steps_per_iteration(cfg, algo: str) -> int:
    """Optimizer steps a train call of ``algo`` takes per iteration: epochs x mini-batches for the
    RL calls, 1 for sft / rm / dpo."""
    return cfg.ppo.epochs * cfg.ppo.mini_batches if algo in ("ppo", "grpo", "remax", "rloo") else 1


def factor_at(cfg, iteration: int, k: int = 0) -> float:
    """The LR multiplier of the k-th optimizer step of ``iteration`` of the run's main stage."""
    per = steps_per_iteration(cfg, cfg.algo)
    o = cfg.optim
    return lr_factor(iteration * per + k, cfg.train.iterations * per, o.schedule, o.warmup, o.min_lr_ratio)


def torch_optimizers(handle) -> list:
    """The torch optimizers behind a model handle: LocalHandle.optim, or the AdamW inside a
    ParallelModel's ZeroAdamW (``optimizer.opt``)."""
    opt = getattr(handle, "optim", None) or getattr(handle, "optimizer", None)
    opt = getattr(opt, "opt", opt)
    return [opt] if opt is not None and hasattr(opt, "param_groups") else []


def set_lr_factor(handle, factor: float) -> float:
    """Set every param group's lr to factor x its base lr (the lr it was built with, kept in the
    group as "base_lr" so per-group multipliers such as the reward head's survive and a checkpoint
    carries it); returns the first group's new lr."""
    first = None
    for opt in torch_optimizers(handle):
        for g in opt.param_groups:
            g.setdefault("base_lr", g["lr"])
            g["lr"] = g["base_lr"] * factor
            first = g["lr"] if first is None else first
    return first if first is not None else float("nan")
