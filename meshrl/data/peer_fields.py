"""The field names of the peers' dataset formats, mapped onto meshrl's records, so that a dataset
made for TRL, verl or OpenRLHF trains here unchanged.

- TRL's conversational format: ``"prompt"`` is a list of ``{"role", "content"}`` messages; it is
  taken as ``"messages"`` (rendered through the chat template: ``data.chat_template=true``). TRL's
  prompt-completion format names the SFT target ``"completion"``: taken as ``"response"``.
- verl's RL parquet files: ``"prompt"`` a list of messages as above, the reference answer in
  ``"reward_model": {"ground_truth": ...}``; OpenRLHF's ``--label_key`` datasets often call it
  ``"ground_truth"`` or ``"label"``; TRL's math datasets ``"solution"``. The first of those a record has
  becomes its ``"answer"`` where it has none.

Every original field stays in the record (a reward function still gets ``data_source``,
``extra_info``, ... through ``**row``); only the record's own ``"answer"``/``"messages"``/
``"response"`` win over the mapping.
"""

from __future__ import annotations

ANSWER_FIELDS = ("reward_model.ground_truth", "ground_truth", "label", "solution")  # first found wins


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
        if "answer" not in out:
            found = (_field(out, name) for name in ANSWER_FIELDS)
            answer = next((v for v in found if v is not None), None)
            if answer is not None:
                out["answer"] = answer
    elif kind == "sft" and "response" not in out and "completion" in out:
        out["response"] = out["completion"]
    return out
