"""Torch threads per process on a shared machine: 1 thread, T spinning threads (OpenMP's default
wait policy), T sleeping threads (OMP_WAIT_POLICY=PASSIVE, meshrl's default: meshrl/cores.py).

    python bench/threads_wait.py [--threads 2] [--seconds 8] [--rounds 2]

Each setting runs in a fresh process (the wait policy is read when torch loads OpenMP), alternated
``--rounds`` times: forward + backward of meshrl's tiny model on 32 x 32 tokens, repeated for
``--seconds``; prints seconds per step (wall and CPU) and the load average. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, os, sys, time
import torch
from meshrl.model.checkpoint import build_model
from meshrl.model.generation import sequence_logprobs
from meshrl.model.presets import get_preset
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
model = build_model(get_preset("tiny"))
ids = torch.randint(1, 200, (32, 32))
def step():
    (-sequence_logprobs(model, ids).mean()).backward()
    model.zero_grad(set_to_none=True)
step()
t0, c0, n = time.perf_counter(), time.process_time(), 0
while time.perf_counter() - t0 < float(sys.argv[2]) or n == 0:
    step()
    n += 1
print(json.dumps({"wall": (time.perf_counter() - t0) / n, "cpu": (time.process_time() - c0) / n,
                  "load": os.getloadavg()[0]}))
"""


def run(threads: int, policy: str | None, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(seconds)], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    settings = [("1 thread", 1, None), (f"{args.threads} threads, spinning (default policy)", args.threads, None),
                (f"{args.threads} threads, sleeping (PASSIVE)", args.threads, "PASSIVE")]
    for r in range(args.rounds):
        for name, t, policy in settings:
            res = run(t, policy, args.seconds)
            print(f"round {r + 1} {name:40s}: {res['wall'] * 1e3:8.1f} ms/step wall, {res['cpu'] * 1e3:8.1f} ms/step "
                  f"CPU (load average {res['load']:.1f})", flush=True)


if __name__ == "__main__":
    main()
