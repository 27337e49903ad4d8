"""Greedy accuracy of checkpoints on the held-out split, by ``transformers`` alone (no meshrl).

    python examples/smollm2/score.py runs/smollm2 runs/smollm2-grpo/actor [--data examples/smollm2/data/eval.jsonl]

For each checkpoint directory: the chat template through ``apply_chat_template``, greedy
``generate`` of at most 16 new tokens (grpo.yaml's ``data.gen_len``), stopping at ``<|im_end|>``,
and ``rewards.correct`` on the text; prints the accuracy per level and overall, so the base model
and the trained one can be compared by a second implementation.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def score(ckpt: str, rows: list[dict], max_new_tokens: int, batch: int = 16) -> dict[str, float]:
    """Accuracy of ``ckpt`` on ``rows`` ({"prompt", "answer", "level"}): per level and "all"."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.spec_from_file_location("smollm2_rewards", HERE / "rewards.py")
    rw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rw)
    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    hits: dict[str, list[float]] = defaultdict(list)
    for i in range(0, len(rows), batch):
        part = rows[i:i + batch]
        texts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                         tokenize=False) for r in part]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=end,
                                 pad_token_id=tok.pad_token_id)
        for r, ids in zip(part, out[:, enc["input_ids"].shape[1]:], strict=True):
            ok = rw.correct(r["prompt"], tok.decode(ids, skip_special_tokens=True), r["answer"])
            hits[f"level {r['level']}"].append(ok)
            hits["all"].append(ok)
    return {k: sum(v) / len(v) for k, v in sorted(hits.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpts", nargs="+", help="checkpoint directories (the base model, trained actors)")
    ap.add_argument("--data", default=str(HERE / "data" / "eval.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    for ckpt in args.ckpts:
        acc = score(ckpt, rows, args.max_new_tokens)
        print(f"{ckpt}: accuracy {acc['all']:.3f} ({round(acc['all'] * len(rows))}/{len(rows)}); "
              + ", ".join(f"{k} {v:.2f}" for k, v in acc.items() if k != "all"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
