"""One side of bench/grpo_vs_trl.py: GRPO iterations with meshrl; prints one JSON object
{"seconds": [per-iteration wall seconds], "cpu": [per-iteration CPU seconds of the process],
"calls": {call: median seconds}}.

    python bench/grpo_meshrl_side.py CKPT_DIR PROMPTS.jsonl ITERATIONS THREADS COMPILE(0|1)
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch


def main() -> None:
    ckpt, data, iters, threads, compile_ = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    from meshrl.algo.trainer import train
    from meshrl.config import load_config

    torch.set_num_threads(threads)
    cfg = load_config(None, [
        "algo=grpo", f"models.actor.path={ckpt}", f"models.ref.path={ckpt}", f"data.path={data}",
        "data.prompt_len=16", "data.gen_len=32", "data.batch_size=8", "data.samples_per_prompt=4",
        "ppo.mini_batches=1", "ppo.epochs=1", "ppo.kl_coef=0.04", "optim.lr=1e-5", "reward.rule=numeric_distance",
        "sft.warmup=false", f"train.iterations={iters}", f"train.threads={threads}", f"gen.compile={compile_ == '1'}"])
    cpu: list[float] = []
    clock = [time.process_time()]

    def log(_line: str) -> None:  # the trainer logs one line per iteration, at its end
        now = time.process_time()
        cpu.append(now - clock[0])
        clock[0] = now

    metrics = train(cfg, None, log=log, progress=False, tensorboard=False).metrics
    calls = sorted(k for k in metrics[0] if k.startswith("time/call/"))
    print(json.dumps({"seconds": [m["time/iteration"] for m in metrics], "cpu": cpu[-len(metrics):],
                      "calls": {k[10:]: statistics.median(m[k] for m in metrics[2:] or metrics) for k in calls}}))


if __name__ == "__main__":
    main()
