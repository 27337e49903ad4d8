"""Greedy accuracy of checkpoints on the held-out split.

    python examples/smollm2/score.py runs/smollm2 runs/smollm2-grpo/actor [--check] [--data FILE.jsonl]

For each checkpoint directory: the chat template, greedy generation of at most 16 new tokens
(grpo.yaml's ``data.gen_len``) stopping at ``<|im_end|>``, and ``rewards.correct`` on the text;
prints the accuracy per level and overall, with progress as it goes. Generation is meshrl's batched
engine (``meshrl generate``'s ``complete``, as in training). ``--check`` also scores every
checkpoint with ``transformers`` alone (``apply_chat_template`` and batched greedy ``generate``), an
independent implementation, and prints how many answers the two agree on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rewards():
    spec = importlib.util.spec_from_file_location("smollm2_rewards", HERE / "rewards.py")
    rw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rw)
    return rw


def accuracy(rows: list[dict], responses: list[str]) -> dict[str, float]:
    """Per level and "all": the share of ``responses`` that ``rewards.correct`` accepts."""
    rw = _rewards()
    hits: dict[str, list[float]] = defaultdict(list)
    for r, text in zip(rows, responses, strict=True):
        ok = rw.correct(r["prompt"], text, r["answer"])
        hits[f"level {r['level']}"].append(ok)
        hits["all"].append(ok)
    return {k: sum(v) / len(v) for k, v in sorted(hits.items())}


def meshrl_responses(ckpt: str, rows: list[dict], max_new_tokens: int, batch: int = 32) -> list[str]:
    """Greedy replies by meshrl's engine, batched, with progress on stderr."""
    from meshrl.commands.generate import complete, encode_all
    from meshrl.data.chat import end_of_turn_id
    from meshrl.model import GenerationConfig, load_pretrained, load_tokenizer

    model, tok = load_pretrained(ckpt).eval(), load_tokenizer(ckpt)
    prompts = encode_all(tok, ckpt, [[{"role": "user", "content": r["prompt"]}] for r in rows], chat=True)
    eos = end_of_turn_id(ckpt, tok)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, greedy=True, eos_token_id=eos,
                           pad_token_id=next(t for t in (tok.pad_token_id, eos) if t is not None))
    out: list[str] = []
    for lo in range(0, len(prompts), batch):
        texts, _, _ = complete(model, prompts[lo:lo + batch], cfg, 0, batch, lambda ids: tok.decode(ids))
        out += texts
        print(f"  {ckpt}: {len(out)}/{len(rows)} answered (meshrl)", file=sys.stderr, flush=True)
    return out


def transformers_responses(ckpt: str, rows: list[dict], max_new_tokens: int, batch: int = 16) -> list[str]:
    """Greedy replies by ``transformers`` alone (no meshrl), batched, with progress on stderr."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    replies: list[str] = []
    for i in range(0, len(rows), batch):
        part = rows[i:i + batch]
        texts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                         tokenize=False) for r in part]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=end,
                                 pad_token_id=tok.pad_token_id)
        replies += [tok.decode(ids, skip_special_tokens=True) for ids in out[:, enc["input_ids"].shape[1]:]]
        print(f"  {ckpt}: {len(replies)}/{len(rows)} answered (transformers)", file=sys.stderr, flush=True)
    return replies


def line(ckpt: str, acc: dict[str, float], n: int, engine: str) -> str:
    return (f"{ckpt} ({engine}): accuracy {acc['all']:.3f} ({round(acc['all'] * n)}/{n}); "
            + ", ".join(f"{k} {v:.2f}" for k, v in acc.items() if k != "all"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpts", nargs="+", help="checkpoint directories (the base model, trained actors)")
    ap.add_argument("--data", default=str(HERE / "data" / "eval.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--check", action="store_true", help="also score with transformers alone and compare")
    args = ap.parse_args(argv)
    rows = [json.loads(text) for text in Path(args.data).read_text().splitlines()]
    for ckpt in args.ckpts:
        ours = meshrl_responses(ckpt, rows, args.max_new_tokens)
        print(line(ckpt, accuracy(rows, ours), len(rows), "meshrl"), flush=True)
        if args.check:
            theirs = transformers_responses(ckpt, rows, args.max_new_tokens)
            same = sum(a.strip() == b.strip() for a, b in zip(ours, theirs, strict=True))
            print(line(ckpt, accuracy(rows, theirs), len(rows), "transformers")
                  + f"; the same reply as meshrl for {same}/{len(rows)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
