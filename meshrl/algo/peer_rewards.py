"""Reward functions written for verl or TRL, called the way their own trainer calls them, so that a
user's existing reward code runs here unchanged (``reward.fn=their_file.py:name``). Which kind a
function is follows from its parameters (user_rewards.load_reward_fn):

- verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``, per
  response: ``solution_str`` the response, ``ground_truth`` the record's answer, ``data_source`` and
  ``extra_info`` the record's fields of those names (None where it has none); any other parameter it
  names is filled from the record. It may return a number or a dict with a ``"score"``, as verl's
  reward managers accept.
- TRL's reward functions ``f(completions, **kwargs) -> list[float | None]``, once per batch:
  ``completions`` the responses (as ``[{"role": "assistant", "content": TEXT}]`` in a chat run,
  data.chat_template=true, as TRL passes conversational completions), ``prompts`` the prompts (the
  record's messages in a chat run), and every other field
  of the records as a list a column, ``answer`` included (TRL passes the dataset's columns so). A
  ``None`` means "does not apply to this row": TRL leaves it out of the weighted sum, here it adds 0.

Everything else is meshrl's own convention, ``name(prompt, response, answer, **row)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..errors import UserError


def kind_of(fn: Callable) -> str:
    """"verl", "trl" or "meshrl", from the function's parameter names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: meshrl's convention
        return "meshrl"
    if "solution_str" in params:
        return "verl"
    if "completions" in params and "response" not in params:
        return "trl"
    return "meshrl"


def verl_call(fn: Callable, where: str) -> Callable[..., object]:
    """verl's ``compute_score`` under meshrl's per-response convention."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def call(prompt: str, response: str, answer: str, **row) -> object:
        args = {**row, "data_source": row.get("data_source"), "solution_str": response, "ground_truth": answer,
                "extra_info": row.get("extra_info")}
        out = fn(**(args if takes_any else {k: v for k, v in args.items() if k in params}))
        if isinstance(out, dict):
            if "score" not in out:
                raise UserError(f"reward function ({where}) returned a dict without \"score\": {sorted(out)}")
            return out["score"]
        return out
    return call


def trl_batch(fn: Callable, chat: bool) -> Callable[..., list]:
    """A TRL reward function as ``batch(prompts, responses, answers, rows) -> values`` (``rows`` each
    record's other fields, its "messages" in a chat run)."""
    def call(prompts: list[str], responses: list[str], answers: list[str], rows: list[dict]) -> list:
        columns = {k: [row.get(k) for row in rows] for k in sorted({k for row in rows for k in row})}
        msgs = columns.pop("messages", [None] * len(rows))
        if chat:
            prompts = [m or [{"role": "user", "content": p}] for m, p in zip(msgs, prompts, strict=True)]
            responses = [[{"role": "assistant", "content": r}] for r in responses]
        return fn(prompts=prompts, completions=responses, answer=answers, **columns)
    return call
