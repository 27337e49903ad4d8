"""Final answers of math responses, for the built-in rules ``gsm8k``, ``last_number`` and
``boxed`` (rewards.py): what a GSM8K or MATH-style dataset brought from verl or TRL is scored by.

- GSM8K writes a solution's final answer after ``####`` ("... so 72 in all.\\n#### 72"); verl's
  GSM8K scorer reads the number after the last ``####`` of the response (its "strict" method, its
  default) or the last number anywhere (its "flexible" one). The reference answer may be the whole
  GSM8K solution or the number alone.
- MATH-style solutions box the answer: ``\\boxed{\\frac{1}{2}}``. The last box's content is compared
  after the normalisations of Hendrycks et al.'s MATH evaluation that need no algebra (spaces,
  ``\\left``/``\\right``, ``\\dfrac``/``\\tfrac``, ``$``, a trailing period, ``\\text{}`` around the
  answer, a leading "x ="); answers equal as numbers are equal ("0.5" and "1/2" are not: no
  symbolic check, as in that evaluation).

Numbers compare as numbers: "1,000", "$1000" and "1000.0" are one answer.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def to_number(text: str) -> float | None:
    """"1,000" / "$1000" / "1000." / "-3.5" -> the float; None if ``text`` is not one number."""
    t = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(t)
    except ValueError:
        return None


def numbers(text: str) -> list[str]:
    """Every number written in ``text``, in order (thousands separators kept: to_number reads them)."""
    return _NUMBER.findall(text)


def after_hashes(text: str) -> str | None:
    """The number after the last ``####`` (GSM8K's final-answer marker), or None."""
    if "####" not in text:
        return None
    found = numbers(text.rsplit("####", 1)[1])
    return found[0] if found else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: the response was cut off inside the box


def normalise(answer: str) -> str:
    """A MATH answer without the differences in writing that do not change it."""
    a = answer.strip().rstrip(".")
    a = re.sub(r"^\\text\{(.*)\}$", r"\1", a)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("$", ""),
                     ("dfrac", "frac"), ("tfrac", "frac"), ("^\\circ", ""), ("^{\\circ}", ""), (" ", "")):
        a = a.replace(old, new)
    a = re.sub(r"^[a-zA-Z]=", "", a)  # "x=5" -> "5"
    return a


def same_answer(got: str | None, want: str) -> bool:
    """Whether a response's extracted answer equals the reference: as numbers where both are, else
    as normalised text."""
    if got is None:
        return False
    g, w = to_number(got), to_number(want)
    if g is not None and w is not None:
        return g == w
    return normalise(got) == normalise(want)


def reference(answer: str, extract) -> str:
    """The reference answer: what ``extract`` finds in it (a whole GSM8K or MATH solution), else itself."""
    found = extract(answer)
    return (found if found is not None else answer).strip()
