"""Response lengths measured by an earlier run, for the planner (pure Python: reads metrics.jsonl).

Every iteration's metrics hold ``response/length`` (the mean generated tokens per response) and
``response/length_max`` (the longest response of the iteration's batch). The planner prices a
generation batch by its longest row and, where the engine compacts, every row by the mean
(estimator.RunShape); these are the two numbers it needs.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..errors import UserError


def measured_lengths(out: str | Path) -> tuple[float, float | None]:
    """(mean response length, longest response of a batch or None) over the iterations of the
    run in ``out`` (its metrics.jsonl); the median over iterations, so one odd iteration does not decide."""
    path = Path(out) / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"--lengths-from {out}: {path} does not exist (a run's --out directory is expected)")
    means, longest = [], []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(path.read_text().splitlines()):
                break  # a last line cut short by a kill
            raise UserError(f"--lengths-from {out}: line {i} of {path} is not JSON") from None
        if "response/length" in rec:
            means.append(float(rec["response/length"]))
        if "response/length_max" in rec:
            longest.append(float(rec["response/length_max"]))
    if not means:
        raise UserError(f"--lengths-from {out}: {path} has no response/length metric (not a generating run)")
    return statistics.median(means), (statistics.median(longest) if longest else None)


def measured_turns(out: str | Path) -> tuple[float, float]:
    """(policy turns per trajectory, tokens per observation) of the multi-turn run in ``out``: the
    medians over iterations of env/turns_mean and env/obs_length."""
    path = Path(out) / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]
    turns = [float(r["env/turns_mean"]) for r in recs if "env/turns_mean" in r]
    if not turns:
        raise UserError(f"--lengths-from {out}: {path} has no env/turns_mean metric (not a multi-turn run; "
                        "this config has env.fn)")
    obs = [float(r.get("env/obs_length", 0.0)) for r in recs if "env/turns_mean" in r]
    return statistics.median(turns), statistics.median(obs)


def apply_lengths(cfg, out: str | Path) -> tuple[float, float | None]:
    """Set cfg.data.gen_len_mean / gen_len_longest from the run in ``out`` (capped at gen_len, at
    least 1). A multi-turn config (env.fn) also gets data.turns_mean and data.obs_len_mean, and
    its gen_len_mean is per turn: the run's policy tokens per trajectory over its turns (the
    longest of a batch is not recorded per turn: None)."""
    mean, longest = measured_lengths(out)
    cap = cfg.data.gen_len
    if getattr(cfg, "env", None) is not None and cfg.env.fn:
        turns, obs = measured_turns(out)
        cfg.data.turns_mean = min(float(cfg.env.max_turns), max(1.0, turns))
        cfg.data.obs_len_mean = min(float(cfg.env.max_tokens), max(0.0, obs))
        cfg.data.gen_len_mean = min(cap, max(1.0, mean / cfg.data.turns_mean))
        cfg.data.gen_len_longest = None
        return cfg.data.gen_len_mean, None
    cfg.data.gen_len_mean = min(cap, max(1.0, mean))
    cfg.data.gen_len_longest = None if longest is None else min(cap, max(cfg.data.gen_len_mean, longest))
    return cfg.data.gen_len_mean, cfg.data.gen_len_longest
