"""Reward functions of the SmolLM2 arithmetic example, used through ``reward.fn``.

    reward.fn: [examples/smollm2/rewards.py:correct, examples/smollm2/rewards.py:concise]
    reward.weights: [1.0, 0.2]

``correct``: 1 when the last number in the response equals the answer, else 0 (a response that
works its way to the answer, "12 + 7 = 19", counts; one that ends on another number does not).
``concise``: a small format term, 1 when the response is only the number (spaces, a final period
and the chat's end-of-turn aside), so that the policy learns to answer without rambling; with
weight 0.2 a right answer scores 1.0-1.2 and a wrong one at most 0.2, so ``eval.correct=1``
(the default) counts exactly the right ones.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` ("1,200" -> "1200", "7.0" -> "7"), or None."""
    found = NUMBER.findall(text)
    if not found:
        return None
    value = float(found[-1].replace(",", ""))
    return str(int(value)) if value.is_integer() else str(value)


def correct(prompt: str, response: str, answer: str, **row) -> float:
    """1.0 when the response's last number equals ``answer``, else 0.0."""
    return 1.0 if last_number(response) == answer.strip() else 0.0


def concise(prompt: str, response: str, answer: str, **row) -> float:
    """1.0 when the response is a bare number (any number: correctness is ``correct``'s job)."""
    return 1.0 if re.fullmatch(r"\s*-?\d+\.?\s*", response) else 0.0
