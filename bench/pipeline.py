"""The README's InstructGPT pipeline on the demo, end to end, per seed: SFT -> reward model -> PPO,
with the actor's greedy exact match on all 100 demo problems after SFT and after PPO, and the
reward model's held-out accuracy (400 pairs whose rejected answers miss by 3).

    python bench/pipeline.py [--seeds 1,2,3] [--out /tmp/meshrl-pipeline] [PPO key=value ...]

Runs the same three commands as the README (with ``train.seed=S`` and its own ``--out``), one at a
time, and prints one row per seed. Extra ``key=value`` items go to the PPO stage only (to try a
setting: e.g. ``ppo.kl_coef=0.1``). The 100 problems are the demo's whole task, so they are
also the PPO stage's prompts: exact match here measures the policy, not generalisation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def meshrl(*args: str) -> None:
    cmd = [sys.executable, "-m", "meshrl.cli", "train", *args, "--no-progress"]
    print("$ meshrl train " + " ".join(args), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def exact_match(model_dir: Path) -> int:
    """How many of the 100 demo problems the checkpoint answers right, greedy."""
    from meshrl.data import demo
    from meshrl.model import ByteTokenizer, GenerationConfig, generate, load_pretrained

    tok, model = ByteTokenizer(), load_pretrained(model_dir).eval()
    recs = demo.prompts()
    out = generate(model, [tok.encode(r["prompt"], add_bos=True) for r in recs],
                   GenerationConfig(max_new_tokens=4, greedy=True, eos_token_id=tok.eos_token_id,
                                    pad_token_id=tok.pad_token_id))
    right = 0
    for r, row in zip(recs, out.responses.tolist(), strict=True):
        right += tok.decode([t for t in row if t != tok.eos_token_id]).strip() == r["answer"]
    return right


def last(metrics: Path, key: str) -> float:
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return [r[key] for r in rows if key in r][-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--out", default="/tmp/meshrl-pipeline")
    ap.add_argument("ppo", nargs="*", help="extra key=value items for the PPO stage")
    args = ap.parse_args()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        d = Path(args.out) / f"seed{seed}"
        shutil.rmtree(d, ignore_errors=True)
        s = f"train.seed={seed}"
        meshrl("algo=sft", s, "--out", str(d / "sft"))
        meshrl("algo=rm", f"models.actor.path={d / 'sft/actor'}", s, "--out", str(d / "rm"))
        meshrl(f"models.actor.path={d / 'sft/actor'}", f"models.reward.path={d / 'rm/reward'}", s, *args.ppo,
               "--out", str(d / "ppo"))
        row = {"seed": seed, "sft_exact": exact_match(d / "sft/actor"), "ppo_exact": exact_match(d / "ppo/actor"),
               "rm_heldout": last(d / "rm/metrics.jsonl", "rm/heldout_accuracy"),
               "ppo_reward_first": json.loads((d / "ppo/metrics.jsonl").read_text().splitlines()[0])["reward/mean"],
               "ppo_reward_last": last(d / "ppo/metrics.jsonl", "reward/mean")}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\nseed | exact match after SFT | after PPO | RM held-out accuracy | learned reward first -> last")
    for r in rows:
        print(f"{r['seed']} | {r['sft_exact']}/100 | {r['ppo_exact']}/100 | {r['rm_heldout']:.3f} | "
              f"{r['ppo_reward_first']:.3f} -> {r['ppo_reward_last']:.3f}")


if __name__ == "__main__":
    main()
