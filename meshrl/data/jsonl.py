"""JSONL datasets: one JSON object per line, and the check every record of a dataset file passes
(``check_record``: JSONL here, Parquet in dataset_file.py). Malformed records raise UserError naming
file and line (or row).

    prompts      {"prompt": str, "answer": str}         (answer optional with a reward model;
                 "messages": [{"role", "content"}, ...] may stand for "prompt" (data.chat_template);
                 any other fields are kept as they are, for user reward functions' ``**row``)
    SFT pairs    {"prompt": str, "response": str}
    preferences  {"prompt": str, "chosen": str, "rejected": str}
                 (either: each field a string or a list of messages, chat_records.py)

The peers' names for these fields are mapped first (peer_fields.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from .peer_fields import is_messages, peer_fields

KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # kind -> (required, optional) keys
    "prompts": ((), ("prompt", "answer")),  # a prompt record needs "prompt" or "messages": check_record
    "sft": (("prompt", "response"), ()),
    "pairs": (("prompt", "chosen", "rejected"), ()),
}


def read_jsonl(path: str | Path, kind: str, renames: tuple[tuple[str, str], ...] = ()) -> list[dict]:
    """Records of ``kind`` (prompts | sft | pairs) from JSONL file ``path``; blank lines are skipped.
    Each line goes through ``check_record`` (the peers' field names mapped first: peer_fields.py)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"dataset file not found: {path}")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    out = [check_record(parse_line(line, f"{path}:{n}"), f"{path}:{n}", kind, renames)
           for n, line in enumerate(lines, start=1) if line.strip()]
    if not out:
        raise UserError(f"dataset {path} has no records")
    return out


def parse_line(line: str, where: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None


def check_record(rec: object, where: str, kind: str, renames: tuple[tuple[str, str], ...] = ()) -> dict:
    """A decoded record of ``kind`` -> meshrl's record: the required and optional keys as strings
    (numbers become strings), a prompt record's other fields kept as they are (for ``reward.fn``'s
    ``**row``). ``renames``: (the file's field, meshrl's) pairs taken first. UserError naming ``where``
    (FILE:LINE, FILE:row N) for what is wrong."""
    required, optional = KINDS[kind]
    if not isinstance(rec, dict):
        raise UserError(f"{where}: expected a JSON object with keys {list(required)}, got {type(rec).__name__}")
    # data.prompt_key / answer_key first (a copy: the record keeps its own field too)
    rec = peer_fields({**rec, **{ours: rec[theirs] for theirs, ours in renames if theirs in rec}}, kind)
    missing = [k for k in required if k not in rec]
    if kind == "prompts" and "prompt" not in rec and "messages" not in rec:
        raise UserError(f"{where}: missing key(s) ['prompt']; this dataset needs ['prompt'] (or \"messages\")")
    if missing:
        raise UserError(f"{where}: missing key(s) {missing}; this dataset needs {list(required)}")
    keys = required + optional
    out = {k: v for k, v in rec.items() if k not in keys} if kind == "prompts" else {}
    for k in keys:
        if k in rec:
            if kind != "prompts" and is_messages(rec[k]):  # a conversation: chat_records.py renders it
                out[k] = rec[k]
                continue
            if not isinstance(rec[k], (str, int, float)) or isinstance(rec[k], bool):
                raise UserError(f"{where}: key {k!r} must be a string, got {type(rec[k]).__name__}")
            out[k] = str(rec[k])
    return out
