"""One side of bench/grpo_vs_trl.py: GRPO iterations with meshrl; prints one JSON object
{"seconds": [per-iteration wall seconds], "cpu": [per-iteration CPU seconds], "calls": {call: median
seconds}}, from the metrics of a ``meshrl train`` run in this process (one rank runs in the
process that calls it; ``time/iteration_cpu`` is that process's CPU time).

    python bench/grpo_meshrl_side.py CKPT_DIR PROMPTS.jsonl ITERATIONS THREADS COMPILE(0|1) [DTYPE|default]

COMPILE 0 and DTYPE default leave gen.compile, train.compile and train.dtype at meshrl's defaults (auto).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile

import torch


def _run(ckpt: str, data: str, iters: int, threads: int, compile_: str, dtype: str, out: str) -> list[dict]:
    """``meshrl train`` (the user's path: the runtime on one rank) -> its metrics records."""
    from meshrl.cli import main as cli
    from meshrl.observe.metrics import read_metrics

    rc = cli(["train", "algo=grpo", f"models.actor.path={ckpt}", f"models.ref.path={ckpt}", f"data.path={data}",
              "data.prompt_len=16", "data.gen_len=32", "data.batch_size=8", "data.samples_per_prompt=4",
              "ppo.mini_batches=1", "ppo.epochs=1", "ppo.kl_coef=0.04", "optim.lr=1e-5",
              "reward.rule=numeric_distance", "sft.warmup=false", f"train.iterations={iters}",
              f"train.threads={threads}", *(["gen.compile=true", "train.compile=true"] if compile_ == "1" else []),
              *([f"train.dtype={dtype}"] if dtype != "default" else []),
              "--out", out, "--no-progress"])
    if rc != 0:
        sys.exit(f"meshrl train exited {rc}")
    return read_metrics(f"{out}/metrics.jsonl")


def main() -> None:
    ckpt, data, iters, threads, compile_ = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    dtype = sys.argv[6] if len(sys.argv) > 6 else "default"  # default: meshrl's (train.dtype=auto)
    if threads:  # 0: train.threads=0, meshrl's default (auto: the usable cores)
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as d:
        metrics = _run(ckpt, data, iters, threads, compile_, dtype, f"{d}/run")
    calls = sorted(k for k in metrics[0] if k.startswith("time/call/"))
    print(json.dumps({"seconds": [m["time/iteration"] for m in metrics],
                      "cpu": [m["time/iteration_cpu"] for m in metrics],
                      "calls": {k[10:]: statistics.median(m[k] for m in metrics[2:] or metrics) for k in calls}}))


if __name__ == "__main__":
    main()
