"""Small planning problems for the tests (pure Python, no torch)."""

from __future__ import annotations

from meshrl.config import load_config
from meshrl.plan.problem import Problem, problem_from_config


def models(actor: str, critic: str | None = None, ref: str | None = None, reward: str | None = None) -> list[str]:
    critic = critic or actor
    return [f"models.actor={actor}", f"models.critic={critic}", f"models.ref={ref or actor}",
            f"models.reward={reward or critic}"]


def problem(*overrides: str, device: str = "h100-80g", off_policy: int | None = None) -> Problem:
    cfg = load_config(None, [f"cluster.device={device}", "data.prompt_len=128", *overrides])
    return problem_from_config(cfg, off_policy=off_policy)
