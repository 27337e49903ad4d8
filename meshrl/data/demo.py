"""The built-in demo task: single-digit addition, generated from a seed (nothing to download).

    prompt "7+5="   answer "12"   (byte tokens, then EOS)

The SFT demonstrations are deliberately *noisy*: with probability ``SFT_NOISE`` the answer is
replaced by a near miss (off by 1..3), like imperfect human demonstrations. SFT therefore learns
the format and a policy that is right only part of the time; RL with the exact-match rule then
has to find, and reinforce, the right answers. That makes the reward rise clearly within minutes
on a CPU while every number stays checkable.

Preference pairs (for the reward model and DPO) prefer the right answer over a near miss.

Twenty of the hundred problems are held out (``is_heldout``): no stage trains on them, and RL runs
on the demo report the policy's greedy accuracy on them (``eval/accuracy``) before the first
iteration and every ``eval.every`` iterations, so what the demo shows is learning, not recall.
"""

from __future__ import annotations

import random

MAX_OPERAND = 9
SFT_NOISE = 0.6  # fraction of SFT answers that are wrong


def is_heldout(a: int, b: int) -> bool:
    """The 20 problems no stage trains on (two per first operand, two per second), kept for evaluation."""
    return (a + 2 * b) % 5 == 0


def problems(split: str = "train") -> list[tuple[int, int]]:
    """The (a, b) with 0 <= a, b <= MAX_OPERAND of a split, in a fixed order: "train" (80 problems: RL
    prompts, SFT demonstrations), "heldout" (the other 20: evaluation only) or "all"."""
    every = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    if split == "all":
        return every
    if split not in ("train", "heldout"):
        raise ValueError(f"unknown split {split!r}")
    return [(a, b) for a, b in every if is_heldout(a, b) == (split == "heldout")]


def _prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


NEAR_MISSES = (-3, -2, -1, 1, 2, 3)
TRAIN_MISSES = (-2, -1, 1, 2)  # rejected answers of the training preference pairs
HELDOUT_MISSES = (-3, 3)  # rejected answers of the held-out pairs: never seen in training


def _near_miss(rng: random.Random, answer: int, offsets: tuple[int, ...] = NEAR_MISSES) -> int:
    """A wrong answer ``answer + offset`` for a random offset, never negative."""
    while True:
        wrong = answer + rng.choice(offsets)
        if wrong >= 0:
            return wrong


def prompts(split: str = "train") -> list[dict[str, str]]:
    """A split's problems once each, with the answer for the rule reward: "train" is the RL prompt set,
    "heldout" the demo's evaluation (eval/accuracy)."""
    return [{"prompt": _prompt(a, b), "answer": str(a + b)} for a, b in problems(split)]


def sft_records(seed: int, n: int, noise: float = SFT_NOISE) -> list[dict[str, str]]:
    """``n`` noisy demonstrations {"prompt", "response"} drawn with ``random.Random(seed)``."""
    rng = random.Random(seed)
    probs = problems()
    out = []
    for _ in range(n):
        a, b = rng.choice(probs)
        ans = a + b if rng.random() >= noise else _near_miss(rng, a + b)
        out.append({"prompt": _prompt(a, b), "response": str(ans)})
    return out


def preference_records(seed: int, n: int, heldout: bool = False) -> list[dict[str, str]]:
    """``n`` pairs {"prompt", "chosen" (right answer), "rejected" (a near miss)}. Training pairs miss
    by 1 or 2, held-out pairs by 3, so no held-out pair is a training pair (both on the training problems)."""
    rng = random.Random(seed)
    offsets = HELDOUT_MISSES if heldout else TRAIN_MISSES
    probs = problems()  # the RL stage's held-out problems stay unseen by the reward model too
    out = []
    for _ in range(n):
        a, b = rng.choice(probs)
        out.append({"prompt": _prompt(a, b), "chosen": str(a + b),
                    "rejected": str(_near_miss(rng, a + b, offsets))})
    return out
