"""Reward functions from the user's own code, and the reward of a response from the run's sources.

    reward.fn=path/to/file.py:name         a function in a file (loaded once per process)
    reward.fn=package.module:name          a function in an importable module
    reward.fn=[a.py:f, b.py:g]  reward.weights=[1.0, 0.5]

Each is called as ``name(prompt, response, answer, **row)``, ``row`` holding every other field of
the dataset record, and must return a number; a function written for verl (``compute_score(
data_source, solution_str, ground_truth, ...)``) or TRL (``f(completions, **kwargs)``, batched) is
called as those trainers call it (peer_rewards.py). The score of a response is sum_k w_k f_k (+ the
overlong penalty); each f_k is reported as ``reward/NAME``. Without reward.fn the registered rule
``reward.rule`` is used (rewards.py). A missing file or name is refused when the config is
validated (before any rank starts); an exception or a non-number stops the job with one message
naming the function, its file and the dataset row.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import UserError
from .peer_rewards import kind_of, trl_batch, verl_call
from .rewards import get_rule
from .user_code import load_user_object


@dataclass(frozen=True)
class RewardFn:
    """One reward source: its metric name, the spec it came from, where its code lives, the callable
    ``fn(prompt, response, answer, **row)``."""

    name: str
    spec: str
    where: str
    fn: Callable[..., object]
    batched: bool = False  # a TRL-style function ``fn(completions, **kwargs)``: once a batch (peer_rewards.trl_batch)


_LOADED: dict[str, RewardFn] = {}


def load_reward_fn(spec: str, key: str = "reward.fn") -> RewardFn:
    """``file.py:name`` or ``module:name`` -> RewardFn; UserError naming ``key`` if it cannot be had
    (the loader of all user code, user_code.py)."""
    if spec in _LOADED:
        return _LOADED[spec]
    fn, name, where = load_user_object(spec, key, "function")
    kind = kind_of(fn)  # verl's and TRL's functions are called as their trainers call them
    out = RewardFn(name, spec, where, verl_call(fn, where) if kind == "verl" else fn, batched=kind == "trl")
    _LOADED[spec] = out
    return out


def rule_fn(rule: str) -> RewardFn:
    """A registered rule ``rule(response, answer)`` under the user-function calling convention."""
    f = get_rule(rule)
    return RewardFn(rule, rule, "meshrl.algo.rewards", lambda prompt, response, answer, **row: f(response, answer))


def reward_sources(cfg) -> tuple[list[RewardFn], list[float]]:
    """The run's reward functions and weights: reward.fn (weights default 1 each), else the rule."""
    if not cfg.reward.fn:
        return [rule_fn(cfg.reward.rule)], [1.0]
    fns = [load_reward_fn(s, f"reward.fn[{i}]" if len(cfg.reward.fn) > 1 else "reward.fn")
           for i, s in enumerate(cfg.reward.fn)]
    return fns, list(cfg.reward.weights) if cfg.reward.weights else [1.0] * len(fns)


def part_names(cfg) -> list[str]:
    """Names of the columns of ``score_parts``: each reward function (made unique), then "overlong"
    when the overlong penalty is on."""
    names: list[str] = []
    for f in (reward_sources(cfg)[0] if cfg.reward.fn else []):
        n, k = f.name, 2
        while n in names:
            n, k = f"{f.name}_{k}", k + 1
        names.append(n)
    return names + (["overlong"] if cfg.reward.overlong_buffer > 0 else [])


def call_reward(f: RewardFn, prompt: str, response: str, answer: str, row: dict, where_row: str) -> float:
    """f(prompt, response, answer, **row) as a float, or one UserError naming f, its file and the row."""
    try:
        v = f.fn(prompt, response, answer, **row)
    except Exception as e:
        raise UserError(f"reward function {f.name} ({f.where}) raised {type(e).__name__}: {e} "
                        f"on {where_row}") from None
    return _number(f, v, where_row)


def _number(f: RewardFn, v: object, where_row: str) -> float:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise UserError(f"reward function {f.name} ({f.where}) returned {v!r}, not a finite number, "
                        f"on {where_row}")
    return float(v)


def overlong_penalty(lengths: torch.Tensor, gen_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025), lengths [B] -> [B] (<= 0):
        0                                  if L <= N - buffer
        -penalty * (L - (N - buffer)) / buffer  otherwise (reaching -penalty at L = N)."""
    exceed = lengths.float() - (gen_len - buffer)
    return -(exceed.clamp(min=0) / buffer) * penalty


def score_texts(cfg, prompts: list[str], responses: list[str], answers: list[str], rows: list[dict],
                where_rows: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per response: (score [B], the unweighted functions' values [B, K]) from the run's sources."""
    fns, weights = reward_sources(cfg)
    cols = [call_batch(f, trl_batch(f.fn, cfg.data.chat_template), prompts, responses, answers, rows, where_rows)
            if f.batched else [call_reward(f, p, r, a, row, w)
                             for p, r, a, row, w in zip(prompts, responses, answers, rows, where_rows, strict=True)]
            for f in fns]
    vals = torch.tensor(cols, dtype=torch.float32).view(len(fns), len(responses)).t()
    return vals @ torch.tensor(weights, dtype=torch.float32), vals


def call_batch(f: RewardFn, batch: Callable[..., list], prompts: list[str], responses: list[str],
               answers: list[str], rows: list[dict], where_rows: list[str]) -> list[float]:
    """A TRL-style function's values for the batch (None: 0), or one UserError naming it."""
    try:
        out = batch(prompts, responses, answers, rows)
    except Exception as e:
        raise UserError(f"reward function {f.name} ({f.where}) raised {type(e).__name__}: {e} "
                        f"on {where_rows[0]} .. {where_rows[-1]}") from None
    if not isinstance(out, (list, tuple)) or len(out) != len(responses):
        raise UserError(f"reward function {f.name} ({f.where}) returned {type(out).__name__} "
                        f"{'of ' + str(len(out)) + ' ' if isinstance(out, (list, tuple)) else ''}"
                        f"for {len(responses)} completions: it must return one number (or None) each")
    return [0.0 if v is None else _number(f, v, w) for v, w in zip(out, where_rows, strict=True)]


def validate_reward(cfg) -> None:
    """Refuse bad reward settings up front, each error naming its key."""
    if cfg.reward.weights and len(cfg.reward.weights) != len(cfg.reward.fn):
        raise UserError(f"reward.weights has {len(cfg.reward.weights)} entries but reward.fn has "
                        f"{len(cfg.reward.fn)}; give one weight per function")
    if cfg.reward.overlong_buffer < 0 or cfg.reward.overlong_buffer > cfg.data.gen_len:
        raise UserError(f"reward.overlong_buffer must be in 0..data.gen_len={cfg.data.gen_len}, "
                        f"got {cfg.reward.overlong_buffer}")
    if cfg.reward.overlong_penalty < 0:
        raise UserError(f"reward.overlong_penalty must be >= 0, got {cfg.reward.overlong_penalty}")
    if cfg.reward.fn:
        reward_sources(cfg)
    else:
        try:
            get_rule(cfg.reward.rule)
        except UserError as e:
            raise UserError(f"reward.rule: {e}") from None
