"""The field names of the peers' dataset formats, mapped onto meshrl's records, so that a dataset
made for TRL, verl or OpenRLHF trains here unchanged.

- TRL's conversational format: ``"prompt"`` is a list of ``{"role", "content"}`` messages; it is
  taken as ``"messages"`` (rendered through the chat template: ``data.chat_template=true``). TRL's
  prompt-completion format names the SFT target ``"completion"``: taken as ``"response"``. Its
  conversational SFT records (``"messages"`` ending with the assistant's turn) become the turns
  before it as ``"prompt"`` and that turn as ``"response"``; its preference records whose
  ``"chosen"`` and ``"rejected"`` are whole conversations (an implicit prompt) become the turns they
  share as ``"prompt"`` and the rest of each (chat_records.py renders them).
- verl's RL parquet files: ``"prompt"`` a list of messages as above, the reference answer in
  ``"reward_model": {"ground_truth": ...}``; OpenRLHF's ``--label_key`` datasets often call it
  ``"ground_truth"`` or ``"label"``; TRL's math datasets ``"solution"``. The first of those a record has
  becomes its ``"answer"`` where it has none.
- The datasets' own files: GSM8K's ``{"question", "answer"}`` and MATH's ``{"problem", "solution"}``
  (the answer a whole solution: the ``gsm8k`` and ``boxed`` rules read its final answer); the
  question or problem is the ``"prompt"`` where a record has none.

Every original field stays in the record (a reward function still gets ``data_source``,
``extra_info``, ... through ``**row``); only the record's own ``"answer"``/``"messages"``/
``"response"`` win over the mapping.
"""

from __future__ import annotations

ANSWER_FIELDS = ("reward_model.ground_truth", "ground_truth", "label", "solution")  # first found wins
PROMPT_FIELDS = ("question", "problem")  # GSM8K's and MATH's own files, where a record has no prompt


def is_messages(value: object) -> bool:
    """A list of {"role", "content"} objects (a chat)."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def _field(rec: dict, dotted: str) -> object | None:
    value: object = rec
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def peer_fields(rec: dict, kind: str) -> dict:
    """A decoded record (prompts | sft | pairs) with the peers' names mapped (a new dict; ``rec``
    is left as it is)."""
    out = dict(rec)
    if kind == "prompts":
        if is_messages(out.get("prompt")) and "messages" not in out:
            out["messages"] = out.pop("prompt")
        if "prompt" not in out and "messages" not in out:
            text = next((out[k] for k in PROMPT_FIELDS if isinstance(out.get(k), str)), None)
            if text is not None:
                out["prompt"] = text
        if "answer" not in out:
            found = (_field(out, name) for name in ANSWER_FIELDS)
            answer = next((v for v in found if v is not None), None)
            if answer is not None:
                out["answer"] = answer
    elif kind == "sft":
        if "response" not in out and "completion" in out:
            out["response"] = out["completion"]
        msgs = out.get("messages")
        if "prompt" not in out and is_messages(msgs) and len(msgs) > 1 and msgs[-1]["role"] == "assistant":
            out["prompt"], out["response"] = msgs[:-1], msgs[-1:]
    elif kind == "pairs" and "prompt" not in out and all(is_messages(out.get(k)) for k in ("chosen", "rejected")):
        n = shared_turns(out["chosen"], out["rejected"])
        if 0 < n < min(len(out["chosen"]), len(out["rejected"])):
            out["prompt"], out["chosen"], out["rejected"] = out["chosen"][:n], out["chosen"][n:], out["rejected"][n:]
    return out


def shared_turns(a: list[dict], b: list[dict]) -> int:
    """How many leading messages two conversations share (TRL's implicit prompt)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
