"""Arithmetic word problems with a numeric answer, as JSONL train and held-out eval splits.

    python examples/smollm2/make_task.py [--out examples/smollm2/data] [--train 1000] [--eval 64]

Four difficulty levels (the ``level`` field of each record, which ``reward.fn`` also receives):

    1  What is 7 + 5?                                     one- and two-digit sums
    2  What is 23 - 8?                                    two-digit differences (non-negative)
    3  Tom has 5 apples and buys 3 more. How many ...?    one-step word problems (+ or -)
    4  What is 6 * 7?                                     products up to 12 x 12

Each record is ``{"prompt", "answer", "level"}``; the answer is the integer as text. The splits
come from fixed seeds (train 1, eval 2) and share no prompt: a prompt is held out when a hash of
its text says so (one in five of each level's prompts), and each split draws only from its own
part. Same arguments, same files, byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ("Tom", "Anna", "Ben", "Maria", "Sam", "Lucy", "Omar", "Mia")
THINGS = ("apples", "books", "coins", "pencils", "stickers", "marbles", "cookies", "cards")


def level1(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 60), rng.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def level2(rng: random.Random) -> tuple[str, int]:
    a = rng.randint(10, 50)
    b = rng.randint(1, a)
    return f"What is {a} - {b}?", a - b


def level3(rng: random.Random) -> tuple[str, int]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 15), rng.randint(1, 9)
    if rng.random() < 0.5:
        return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
    a = max(a, b + 1)
    return f"{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?", a - b


def level4(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"What is {a} * {b}?", a * b


LEVELS: dict[int, Callable[[random.Random], tuple[str, int]]] = {1: level1, 2: level2, 3: level3, 4: level4}


def held_out(prompt: str) -> bool:
    """One prompt in five belongs to the eval split (a hash of its text: no list to keep)."""
    return hashlib.sha256(prompt.encode()).digest()[0] % 5 == 0


def draw(n: int, seed: int, eval_split: bool) -> list[dict]:
    """``n`` records of one split, levels in turn (1, 2, 3, 4, 1, ...); the eval split has no
    prompt twice (the train split may: level 4 has 121 prompts)."""
    rng = random.Random(seed)
    out: list[dict] = []
    seen: set[str] = set()
    while len(out) < n:
        level = len(out) % len(LEVELS) + 1
        prompt, answer = LEVELS[level](rng)
        if held_out(prompt) == eval_split and not (eval_split and prompt in seen):
            seen.add(prompt)
            out.append({"prompt": prompt, "answer": str(answer), "level": level})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    ap.add_argument("--train", type=int, default=1000, help="train records")
    ap.add_argument("--eval", type=int, default=64, help="held-out eval records")
    args = ap.parse_args(argv)
    train = draw(args.train, seed=1, eval_split=False)
    heldout = draw(args.eval, seed=2, eval_split=True)
    out = Path(args.out)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", heldout)
    print(f"wrote {out / 'train.jsonl'} ({len(train)} records) and {out / 'eval.jsonl'} ({len(heldout)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
