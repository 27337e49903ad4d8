"""The allowed range of every numeric config key, checked when a config is loaded
(Config.validate), so a bad value is one message naming the key before anything runs: zero or a
negative where a count or a rate must be positive, nan and infinities, or an empty string.
The names a key must take from another package (a device, a model preset, a loss variant) are
checked by their owners (meshrl/commands/settings.py).

One table instead of checks scattered over the code that reads each key; a key absent from it
has no range beyond its type (e.g. a seed, or ppo.kl_coef = 0, which turns the KL term off).
"""

from __future__ import annotations

import dataclasses
import math

from .errors import UserError

# key -> (lowest allowed, whether that bound itself is allowed, highest allowed or None)
RANGES: dict[str, tuple[float, bool, float | None]] = {
    "train.iterations": (1, True, None), "train.threads": (0, True, None), "train.save_every": (1, True, None),
    "train.timeout": (0, False, None),
    "train.seed": (0, True, None), "train.off_policy_max": (0, True, None), "train.grad_bucket_mb": (0, False, None),
    "optim.lr": (0, False, None), "optim.critic_lr": (0, False, None), "optim.weight_decay": (0, True, None),
    "optim.grad_clip": (0, True, None),
    "ppo.clip": (0, False, None), "ppo.value_clip": (0, False, None), "ppo.gamma": (0, True, 1.0),
    "ppo.lam": (0, True, 1.0), "ppo.kl_coef": (0, True, None), "ppo.entropy_coef": (0, True, None),
    "gen.temperature": (0, False, None), "gen.top_k": (0, True, None), "gen.top_p": (0, False, 1.0),
    "sft.steps": (1, True, None), "sft.lr": (0, False, None), "sft.batch_size": (1, True, None),
    "dpo.beta": (0, False, None), "env.max_turns": (1, True, None), "env.max_tokens": (1, True, None),
    "replan.every": (0, True, None), "replan.min_gain": (0, True, None), "replan.search_steps": (1, True, None),
}


def leaves(obj: object, prefix: str = "") -> dict[str, object]:
    """Every leaf key of a config dataclass -> its value."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out.update(leaves(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v) else {f"{prefix}{f.name}": v})
    return out


def check_ranges(cfg: object) -> None:
    """UserError naming the first key whose value is out of its range (see RANGES)."""
    for key, v in leaves(cfg).items():
        if isinstance(v, str) and v == "":
            hint = " (or none)" if key.endswith(".path") else ""
            raise UserError(f"config key {key} is empty; give a value{hint}")
        if isinstance(v, float) and not math.isfinite(v):
            raise UserError(f"config key {key} must be a finite number, got {v}")
        if key in RANGES and not isinstance(v, bool):
            lo, lo_ok, hi = RANGES[key]
            if not (v >= lo if lo_ok else v > lo) or (hi is not None and v > hi):
                want = f"{'>=' if lo_ok else '>'} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
                raise UserError(f"config key {key} must be {want}, got {v}")
