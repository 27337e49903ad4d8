"""Streaming with partial rollouts against whole batches at the same lag, side by side in one run.

For each lag k (``train.off_policy=k``) and each ``train.stream_steps`` S (0: whole batches, each
sampled by one version; S >= 1: each batch decoded S tokens a version, its sequences in flight
continuing under new weights, finished at the bound), the same run on ``--nprocs`` local gloo ranks
under one plan (default: disaggregated). Printed per row: the median wall time per iteration after
the first k + 1 (timing: the machine's), and the deterministic figures of the stream: the mean and
largest per-token staleness, the share of sequences interrupted and finished at the bound, and the
reward of the last iteration (a fixed seed gives the same figures on every run and every plan).

    python bench/partial_rollouts.py [--nprocs 4] [--iterations 8] [--plan disaggregated]
                                     [--ks 2,4] [--steps 0,6,12] [key=value ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

DEFAULTS = ["algo=grpo", "data.batch_size=8", "data.samples_per_prompt=4", "data.gen_len=24", "sft.warmup=false",
            "train.save_every=1000"]


def summary(records: list[dict], k: int) -> dict:
    """The steady-state seconds per iteration and the stream's figures after the first k + 1."""
    rest = [r for r in records if r["iteration"] > k]
    if not rest:
        raise SystemExit(f"--iterations must be > {k + 1} to measure lag {k}'s steady state")

    def mean(key: str) -> float:
        return statistics.fmean(r.get(key, 0.0) for r in rest)

    return {"measured_s": statistics.median(r["time/iteration"] for r in rest),
            "staleness_mean": mean("rollout/staleness_mean"),
            "staleness_max": max(r.get("rollout/staleness_max", 0.0) for r in rest),
            "interrupted": mean("rollout/interrupted"), "at_bound": mean("rollout/at_bound"),
            "reward_last": records[-1]["reward/mean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--plan", default="disaggregated")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--steps", default="0,6,12")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from meshrl.config import load_config
    from meshrl.runtime.job import launch

    t0 = time.perf_counter()
    rows = []
    for k in (int(x) for x in args.ks.split(",")):
        for s in (int(x) for x in args.steps.split(",")):
            cfg = load_config(None, DEFAULTS + [f"train.iterations={args.iterations}", f"train.off_policy={k}",
                                                f"train.stream_steps={s}"] + args.overrides)
            with tempfile.TemporaryDirectory() as out:
                records = launch(cfg, args.plan, args.nprocs, Path(out), quiet=True)
            rows.append({"k": k, "stream_steps": s, **summary(records, k)})
    result = {"config": DEFAULTS + args.overrides, "nprocs": args.nprocs, "plan": args.plan,
              "iterations": args.iterations, "rows": rows, "bench_s": time.perf_counter() - t0}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.nprocs} ranks, --plan {args.plan}, {' '.join(DEFAULTS + args.overrides)}")
    print("k  S    measured_s  vs S=0  staleness mean/max  interrupted  at_bound  reward (last)")
    whole = {r["k"]: r["measured_s"] for r in rows if r["stream_steps"] == 0}  # the ratio's reference per k
    for r in rows:
        gain = whole.get(r["k"], r["measured_s"]) / r["measured_s"]
        print(f"{r['k']:<2} {r['stream_steps']:<4} {r['measured_s']:<11.3f} {gain:<7.2f} "
              f"{r['staleness_mean']:.2f} / {r['staleness_max']:.0f}{'':<11} {r['interrupted']:<12.2f} "
              f"{r['at_bound']:<9.2f} {r['reward_last']:.3f}")
    print(f"({result['bench_s']:.0f} s)")


if __name__ == "__main__":
    main()
