"""Rule rewards: Python functions registered by name, for tasks whose answers can be checked.

    @register_rule("exact_match")
    def exact_match(response: str, answer: str) -> float: ...

``reward.rule=NAME`` in the config picks one. Built in: ``exact_match``, ``numeric_distance``, and
for math datasets ``gsm8k``, ``last_number`` and ``boxed`` (math_answers.py). A reward *model* is used instead when
``models.reward.path`` is set (see calls.reward_inf).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UserError
from .math_answers import after_hashes, last_boxed, numbers, reference, same_answer

Rule = Callable[[str, str], float]
RULES: dict[str, Rule] = {}


def register_rule(name: str) -> Callable[[Rule], Rule]:
    """Decorator: make ``fn(response, answer) -> float`` available as ``reward.rule=name``."""
    def deco(fn: Rule) -> Rule:
        if name in RULES and RULES[name] is not fn:
            raise ValueError(f"reward rule {name!r} is already registered")
        RULES[name] = fn
        return fn
    return deco


def get_rule(name: str) -> Rule:
    try:
        return RULES[name]
    except KeyError:
        raise UserError(f"unknown reward rule {name!r}; registered rules: {', '.join(sorted(RULES))}") from None


@register_rule("exact_match")
def exact_match(response: str, answer: str) -> float:
    """1 if the response, stripped of surrounding whitespace, equals the answer; else 0."""
    return 1.0 if response.strip() == answer.strip() else 0.0


@register_rule("numeric_distance")
def numeric_distance(response: str, answer: str) -> float:
    """1 for the right number, falling linearly to 0 at a distance of 10; 0 if not a number.
    A denser signal than exact_match for arithmetic tasks."""
    try:
        got, want = float(response.strip()), float(answer.strip())
    except ValueError:
        return 0.0
    return max(0.0, 1.0 - abs(got - want) / 10.0)


@register_rule("gsm8k")
def gsm8k(response: str, answer: str) -> float:
    """1 if the number after the response's last ``####`` equals the answer's (a GSM8K solution's
    final answer, or the number alone), else 0: verl's GSM8K scorer ("strict", its default)."""
    return float(same_answer(after_hashes(response), reference(answer, after_hashes)))


@register_rule("last_number")
def last_number(response: str, answer: str) -> float:
    """1 if the last number in the response equals the answer's final number (after ``####``
    where it has one), else 0: verl's "flexible" GSM8K method."""
    found = numbers(response)
    return float(same_answer(found[-1] if found else None, reference(answer, after_hashes)))


@register_rule("boxed")
def boxed(response: str, answer: str) -> float:
    """1 if the response's last ``\\boxed{}`` holds the answer (the answer's own last box where it
    is a whole MATH solution), after math_answers.normalise, else 0."""
    return float(same_answer(last_boxed(response), reference(answer, last_boxed)))
