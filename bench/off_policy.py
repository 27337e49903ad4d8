"""Asynchronous RL on local ranks: measured and predicted iteration time at each lag k.

For k in 0, 1, 2, 4 (``train.off_policy=k``), the same run on ``--nprocs`` local gloo ranks under
one plan (default: the disaggregated strategy, whose generation has its own ranks and can overlap
training); the median wall time per iteration in the steady state (the first k + 1 iterations,
which fill the pipeline, are left out), beside the planner's steady-state prediction for that plan
and lag (meshrl/plan/simulator.py: the CPU profile of this machine, `meshrl profile`; without one the
stand-in preset, and the prediction is then only a shape). Then what ``train.off_policy=auto``
chooses. Every lag runs in this one invocation, one after another, so the ratios compare like with like.
Beside the times, the reward curve: the mean reward of the first and of the second half of the
iterations (each lag trains on the same number of samples).

Workloads: the built-in demo (``--workload demo``: PPO on single-digit addition after its SFT
warm-up) or ``--workload llama3m``: GRPO on bench/grpo_vs_trl.py's 3.2M LLaMA and addition prompts
(8 prompts x 4 samples, 32 new tokens, KL 0.04 to a reference).

    python bench/off_policy.py [--workload demo|llama3m] [--nprocs 4] [--iterations 12] [--plan disaggregated]
                               [--ks 0,1,2,4] [key=value ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = {
    "demo": ["algo=ppo", "data.batch_size=16", "train.save_every=1000"],
    "llama3m": ["algo=grpo", "data.prompt_len=16", "data.gen_len=32", "data.batch_size=8", "data.samples_per_prompt=4",
                "ppo.mini_batches=1", "ppo.kl_coef=0.04", "optim.lr=1e-5", "reward.rule=numeric_distance",
                "sft.warmup=false", "train.save_every=1000"],
}


def workload(name: str, root: Path) -> list[str]:
    """The workload's config items (llama3m: its checkpoint and prompts, written under ``root``)."""
    if name != "llama3m":
        return WORKLOADS[name]
    sys.path.insert(0, str(Path(__file__).parent))
    from grpo_vs_trl import make_inputs

    ckpt, data = make_inputs(root)
    return [f"models.actor.path={ckpt}", f"models.ref.path={ckpt}", f"data.path={data}", *WORKLOADS[name]]


def halves(records: list[dict]) -> tuple[float, float]:
    """Mean reward of the first and the second half of the iterations."""
    r = [x["reward/mean"] for x in records]
    return statistics.mean(r[:len(r) // 2]), statistics.mean(r[len(r) // 2:])


def steady_s(records: list[dict], k: int) -> float:
    """Median seconds per iteration after the first k + 1 (the pipeline filling up)."""
    rest = [r["time/iteration"] for r in records if r["iteration"] > k]
    if not rest:
        raise SystemExit(f"--iterations must be > {k + 1} to measure lag {k}'s steady state")
    return statistics.median(rest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="demo")
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--plan", default="disaggregated")
    ap.add_argument("--ks", default="0,1,2,4")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from meshrl.config import load_config
    from meshrl.plan.lag import choose_lag, with_lag
    from meshrl.plan.simulator import iteration_time
    from meshrl.runtime.job import launch
    from meshrl.runtime.plans import _problem, resolve_plan, run_cluster

    ks = [int(k) for k in args.ks.split(",")]
    tmp = tempfile.TemporaryDirectory()
    items = workload(args.workload, Path(tmp.name)) + [f"train.iterations={args.iterations}"] + args.overrides
    base = load_config(None, items)
    cluster = run_cluster(base, args.nprocs)
    t0 = time.perf_counter()
    rows = {}
    for k in ks:
        cfg = with_lag(base, k)
        plan, _ = resolve_plan(cfg, args.plan, args.nprocs)
        problem, note = _problem(cfg, cluster)
        with tempfile.TemporaryDirectory() as out:
            records = launch(cfg, args.plan, args.nprocs, Path(out), quiet=True)
        rows[k] = {"measured_s": steady_s(records, k), "predicted_s": iteration_time(problem, plan),
                   "staleness_max": max(r.get("rollout/staleness_max", 0.0) for r in records),
                   "reward_halves": halves(records)}
    auto_cfg = with_lag(base, "auto")
    problem, note = _problem(auto_cfg, cluster)
    auto = choose_lag(problem, lambda p: resolve_plan(with_lag(auto_cfg, p.off_policy), args.plan, args.nprocs)[0])
    tmp.cleanup()
    result = {"workload": args.workload, "config": items, "nprocs": args.nprocs, "plan": args.plan,
              "iterations": args.iterations, "rows": rows, "auto_k": auto.k, "profile_note": note,
              "bench_s": time.perf_counter() - t0}
    if args.json:
        print(json.dumps(result))
        return
    m0, p0 = rows[ks[0]]["measured_s"], rows[ks[0]]["predicted_s"]
    print(f"{args.workload}: {args.nprocs} ranks, --plan {args.plan}, {args.iterations} iterations, "
          f"{' '.join(WORKLOADS[args.workload] + args.overrides)}")
    print("k  measured_s  gain    predicted_s  gain    staleness_max  reward/mean 1st half -> 2nd half")
    for k, r in rows.items():
        print(f"{k:<2} {r['measured_s']:<11.3f} {m0 / r['measured_s']:<7.2f} {r['predicted_s']:<12.4f} "
              f"{p0 / r['predicted_s']:<7.2f} {r['staleness_max']:<14.0f} {r['reward_halves'][0]:.3f} -> "
              f"{r['reward_halves'][1]:.3f}")
    print(f"train.off_policy=auto chooses k={auto.k}" + (f" ({note})" if note else ""))
    print(f"({result['bench_s']:.0f} s)")


if __name__ == "__main__":
    main()
