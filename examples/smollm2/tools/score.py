"""Held-out accuracy and tool use of a checkpoint on the tool task, by kind of problem, greedy:

    python examples/smollm2/tools/score.py runs/smollm2 runs/smollm2-tools/actor

Each checkpoint plays the 64 held-out conversations of data/eval.jsonl through the environment
(calc_env.py, the calculator sandboxed) exactly as the run's evaluation does (meshrl's multi-turn
rollout on one process), and the table gives, per kind (product, sum) and overall: the share
answered right, the share that called the calculator, and the share right without calling it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def score(ckpt: str, threads: int) -> dict[str, tuple[float, float, float]]:
    from meshrl.algo import setup
    from meshrl.algo.calls import Place, generate_rows
    from meshrl.algo.common import CallContext
    from meshrl.algo.evaluate import eval_batch
    from meshrl.algo.handles import LocalHandle
    from meshrl.config import load_config
    from meshrl.model import load_pretrained

    torch.set_num_threads(threads)
    cfg = load_config(str(HERE / "tools.yaml"), [f"models.actor.path={ckpt}", f"models.ref.path={ckpt}"])
    tok = setup.tokenizer_for(cfg)
    batch = eval_batch(cfg, tok)
    out = generate_rows(LocalHandle(load_pretrained(ckpt)), batch, CallContext(cfg, 0, tok, algo="eval"), Place(),
                        greedy=True)
    kinds = [json.loads(line)["kind"] for line in Path(cfg.eval.path).read_text().splitlines()]
    right, tool = out["env_reward"] >= 1.0, out["env_counts"][:, 1] > 0
    table = {}
    for kind in sorted(set(kinds)) + ["all"]:
        rows = torch.tensor([kind in ("all", k) for k in kinds])
        table[kind] = (float(right[rows].float().mean()), float(tool[rows].float().mean()),
                       float((right & ~tool)[rows].float().mean()))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpts", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print("checkpoint | kind | right | used the tool | right without it")
    for ckpt in args.ckpts:
        for kind, (r, t, alone) in score(ckpt, args.threads).items():
            print(f"{ckpt} | {kind} | {r:.3f} | {t:.3f} | {alone:.3f}")


if __name__ == "__main__":
    main()
