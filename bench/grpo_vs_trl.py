"""A GRPO iteration, meshrl against TRL's GRPOTrainer, side by side in one run.

    python bench/grpo_vs_trl.py [--steps 8] [--rounds 2] [--threads 0] [--compile] [--dtype float32|bfloat16]
                                 [--trl-dtype float32|bfloat16] [--trl-compile] [--trl-venv DIR]

The setting: a 3.2M-parameter LLaMA (bench_models.LLAMA_3M, random weights, one checkpoint
directory read by both), 8 addition prompts x 4 samples, at most 32 new tokens, one optimizer step
per iteration, KL to a reference model (coefficient 0.04 on both sides), the same rule reward.
TRL runs in its own virtual environment, made on first use by this script (``--trl-venv``, default
~/.cache/meshrl/trl-venv): ``pip install trl==1.16.0`` over this environment's torch and
transformers (a .pth file), so both sides run the same torch and transformers. Not part of CI.

Each side runs in a fresh process, alternately, ``--rounds`` times; an iteration's time is its wall
time (meshrl's from its metrics.jsonl, one ``meshrl train`` run; TRL's from a callback); the first
two iterations of each process (warm-up, compile) are dropped. Each side also reports its process's
CPU time per iteration (meshrl's one rank runs in the process that calls ``meshrl train``), the
steadier measure on a shared machine. Prints medians and TRL/meshrl (> 1: meshrl is faster).

Precision: ``--dtype`` is meshrl's ``train.dtype`` (bfloat16: bf16 weights, fp32 master weights and
moments); ``--trl-dtype`` TRL's (bfloat16: ``bf16=True``, TRL's own default, autocast over fp32
weights; float32: ``bf16=False``, TRL's faster setting on a CPU). meshrl defaults to its own defaults
(``train.dtype=auto``: bfloat16 on a CPU with bf16 dot products, else float32; ``compile=auto``), TRL to float32.
The README's headline: ``--rounds 3 --compile --dtype bfloat16`` (against TRL's default) and
``... --trl-dtype float32`` (against TRL's fastest).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import site
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRL_VERSION = "1.16.0"


def trl_python(venv: Path) -> Path:
    """The TRL venv's python, creating the venv (and installing TRL) if needed."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import trl"], capture_output=True).returncode == 0:
        return py
    print(f"making {venv} with trl=={TRL_VERSION} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    inner = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                           capture_output=True, text=True).stdout.strip()
    Path(inner, "meshrl_base_env.pth").write_text(site.getsitepackages()[0] + "\n")  # our torch/transformers
    subprocess.run([py, "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}"], check=True)
    return py


def make_inputs(root: Path) -> tuple[Path, Path]:
    """A checkpoint directory (model + byte tokenizer) and a prompts JSONL of 64 additions."""
    import torch
    from bench_models import LLAMA_3M, save_byte_tokenizer

    from meshrl.model.transformer import CausalLM

    torch.manual_seed(0)
    ckpt = root / "ckpt"
    CausalLM(LLAMA_3M).save_pretrained(str(ckpt))
    save_byte_tokenizer(ckpt)
    rng = random.Random(0)
    data = root / "prompts.jsonl"
    with data.open("w") as f:
        for _ in range(64):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return ckpt, data


def run_side(cmd: list[str], env: dict[str, str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd[:2])} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="iterations per process (the first 2 are dropped)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per side, alternating")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads on both sides (0: meshrl's default, the usable cores; meshrl/cores.py)")
    ap.add_argument("--compile", action="store_true", help="meshrl with gen.compile=true and train.compile=true "
                    "(default: meshrl's own choice, compile=auto)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"),
                    help="meshrl's train.dtype (bfloat16: bf16 weights, fp32 master weights; default: meshrl's "
                    "own, train.dtype=auto: bfloat16 on a CPU with bf16 dot products, else float32)")
    ap.add_argument("--trl-dtype", choices=("float32", "bfloat16"),
                    help="TRL's precision (bfloat16: bf16=True, TRL's default, autocast); default: --dtype")
    ap.add_argument("--trl-compile", action="store_true", help="TRL with torch_compile=True (the Trainer "
                    "compiles the model; not TRL's default)")
    ap.add_argument("--trl-venv", default=str(Path.home() / ".cache" / "meshrl" / "trl-venv"))
    args = ap.parse_args()
    from meshrl.cores import usable_cores

    args.threads = args.threads or usable_cores()  # what train.threads=0 gives a one-rank run
    py_trl = trl_python(Path(args.trl_venv))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(args.threads)}
    sys.path.insert(0, str(HERE))
    with tempfile.TemporaryDirectory() as d:
        ckpt, data = make_inputs(Path(d))
        n = str(args.steps)
        ours_cmd = [sys.executable, str(HERE / "grpo_meshrl_side.py"), str(ckpt), str(data), n, str(args.threads),
                    "1" if args.compile else "0", args.dtype or "default"]
        trl_cmd = [str(py_trl), str(HERE / "grpo_trl_side.py"), str(ckpt), str(data), n, str(args.threads),
                   args.trl_dtype or args.dtype or "float32", "1" if args.trl_compile else "0"]
        res: dict[str, dict[str, list[float]]] = {s: {"seconds": [], "cpu": []} for s in ("meshrl", "trl")}
        calls: list[dict] = []
        for r in range(args.rounds):
            for name, cmd in (("meshrl", ours_cmd), ("trl", trl_cmd)):
                out = run_side(cmd, env)
                for k in ("seconds", "cpu"):
                    res[name][k] += out.get(k, [])[2:]
                calls += [out["calls"]] if "calls" in out else []
                print(f"round {r + 1} {name:6s}: median {statistics.median(out['seconds'][2:]):.3f} s/iteration",
                      flush=True)
    import torch
    import transformers
    print(f"GRPO iteration, 3.2M-parameter LLaMA, 8 prompts x 4 samples, <= 32 new tokens, KL to a reference, "
          f"one optimizer step; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"trl {TRL_VERSION}; {args.threads} thread(s); meshrl "
          f"{'gen.compile=train.compile=true' if args.compile else 'compile at its default (auto)'}, "
          f"train.dtype={args.dtype or 'auto (its default)'}; TRL {args.trl_dtype or args.dtype or 'float32'}"
          f"{', torch_compile' if args.trl_compile else ''}; "
          f"medians of {len(res['meshrl']['seconds'])} iterations a side")
    for kind, label in (("seconds", "wall"), ("cpu", "cpu")):
        o, t = statistics.median(res["meshrl"][kind]), statistics.median(res["trl"][kind])
        print(f"  by {label:4s} time: meshrl {o:.3f} s, TRL GRPOTrainer {t:.3f} s, TRL/meshrl {t / o:.2f}x")
    if calls:
        med = {k: statistics.median(c[k] for c in calls) for k in calls[0]}
        print("  meshrl calls (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))


if __name__ == "__main__":
    main()
