"""Multi-digit arithmetic for the tool example, as JSONL train and held-out eval splits.

    python examples/smollm2/tools/make_task.py [--out examples/smollm2/tools/data] [--train 1000] [--eval 64]

Two kinds of problem, in equal shares, each too hard for SmolLM2-135M to do in its head: products
of a three-digit and a two-digit number (``What is 347 * 28?``) and sums of two four-digit numbers
(``What is 4821 + 3967?``). Each record is ``{"messages", "answer", "kind"}``: a system turn that
tells the model about the calculator, one worked exchange (a tool call, its result, the answer),
then the question. A prompt is held out when a hash of its text says so
(one in five), and each split draws only from its own part, so no prompt is in both; fixed seeds
(train 1, eval 2) give the same files byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

SYSTEM = "You can use a calculator: write the calculation inside <calc></calc> and you get the result."
# One worked exchange before the question, as earlier turns of the conversation: the format of a
# tool call and of the answer after it.
EXAMPLE = [{"role": "user", "content": "What is 123 * 45?"}, {"role": "assistant", "content": "<calc>123 * 45</calc>"},
           {"role": "user", "content": "5535"}, {"role": "assistant", "content": "The answer is 5535."}]


def product(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(100, 999), rng.randint(11, 99)
    return f"What is {a} * {b}?", a * b


def total(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
    return f"What is {a} + {b}?", a + b


KINDS = {"product": product, "sum": total}


def held_out(prompt: str) -> bool:
    return hashlib.sha256(prompt.encode()).digest()[0] % 5 == 0


def records(n: int, seed: int, heldout: bool) -> list[dict]:
    rng, out, seen = random.Random(seed), [], set()
    kinds = list(KINDS)
    while len(out) < n:
        kind = kinds[len(out) % len(kinds)]
        prompt, answer = KINDS[kind](rng)
        if held_out(prompt) != heldout or prompt in seen:
            continue
        seen.add(prompt)
        messages = [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": prompt}]
        out.append({"messages": messages, "answer": str(answer), "kind": kind})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).with_name("data")))
    ap.add_argument("--train", type=int, default=1000)
    ap.add_argument("--eval", type=int, default=64)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, n, seed, heldout in (("train", args.train, 1, False), ("eval", args.eval, 2, True)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(n, seed, heldout)))
        print(f"wrote {out / name}.jsonl: {n} records")


if __name__ == "__main__":
    main()
