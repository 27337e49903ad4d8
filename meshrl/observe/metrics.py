"""Metrics sinks: one JSON object per iteration in metrics.jsonl, the same scalars in TensorBoard,
and a one-line console summary.

Keys (DESIGN.md): ``iteration``, ``reward/mean``, losses, ``kl/*``; everything that depends on
timing is under ``time/`` or ``perf/``, and every other figure is deterministic for a fixed seed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

TIMING_PREFIXES = ("time/", "perf/")


def deterministic_part(record: dict) -> dict:
    """The record without its timing-dependent keys (what must repeat exactly for a fixed seed)."""
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


class MetricsWriter:
    """Appends to ``out/metrics.jsonl`` and writes TensorBoard events under ``out/tensorboard``."""

    def __init__(self, out: str | Path, tensorboard: bool = True) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "metrics.jsonl"
        self.path.write_text("")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported here: it is slow to import

            self.tb = SummaryWriter(str(self.out / "tensorboard"))

    def write(self, record: dict) -> None:
        """record: {"iteration": int, name: float, ...}; non-finite floats are written as null."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.tb is not None:
            step = int(record["iteration"])
            for k, v in record.items():
                if k != "iteration" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()


def no_signal_note(record: dict) -> str | None:
    """A note when every sample of an iteration got the same reward: then every advantage is 0 (or
    rounding noise) and nothing is learned, while every metric stays at 0 or drifts on noise. This
    was the cause of 'all-zero metrics' on a user's 2-prompt dataset: the actor never produced a
    rewarded answer. None when the rewards differ (or the run reports none)."""
    if record.get("reward/std") != 0.0 or "reward/mean" not in record:
        return None
    return (f"note: at iteration {record['iteration']} every sample got the same reward "
            f"({record['reward/mean']:.3g}), so that iteration's advantages are 0 and it teaches nothing. On a "
            "hard task early iterations often look like this and the run learns from those whose samples "
            "differ; if no sample is ever rewarded, check reward.rule against your answers, start from a "
            "trained actor (models.actor.path) or an SFT warm-up on your data (sft.path), or sample more "
            "(data.samples_per_prompt, gen.temperature). (Said once.)")


def eval_summary(records: list[dict]) -> list[str]:
    """The run's held-out evaluations, for its last lines: a row per evaluation, then first -> last."""
    evals = [r for r in records if "eval/accuracy" in r]
    if not evals:
        return []
    extra = [k for k in evals[0] if k.startswith("eval/pass@")]
    rows = ["held-out evaluation (the policy at the start of the iteration):",
            "  iteration  eval/accuracy  eval/reward" + "".join(f"  {k}" for k in extra)]
    for r in evals:
        rows.append(f"  {r['iteration']:9d}  {r['eval/accuracy']:13.3f}  {r.get('eval/reward', float('nan')):11.3f}"
                    + "".join(f"  {r.get(k, float('nan')):{len(k)}.3f}" for k in extra))
    first, last = evals[0], evals[-1]
    rows.append(f"eval/accuracy: {first['eval/accuracy']:.3f} at iteration {first['iteration']} -> "
                f"{last['eval/accuracy']:.3f} at iteration {last['iteration']}")
    return rows


def summary_line(record: dict, keys: tuple[str, ...]) -> str:
    """'it   3 | reward/mean 0.412 | actor/pg_loss -0.013 | ...' for the keys present."""
    parts = [f"it {record['iteration']:3d}"]
    for k in keys:
        if k in record and record[k] is not None:
            v = record[k]
            parts.append(f"{k} {v:.3f}" if abs(v) >= 1e-3 or v == 0 else f"{k} {v:.2e}")
    return " | ".join(parts)


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
