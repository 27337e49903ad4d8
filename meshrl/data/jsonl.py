"""JSONL datasets: one JSON object per line. Malformed lines raise UserError naming file and line.

    prompts      {"prompt": str, "answer": str}         (answer optional with a reward model;
                 "messages": [{"role", "content"}, ...] may stand for "prompt" (data.chat_template);
                 any other fields are kept as they are, for user reward functions' ``**row``)
    SFT pairs    {"prompt": str, "response": str}
    preferences  {"prompt": str, "chosen": str, "rejected": str}
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError

KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # kind -> (required, optional) keys
    "prompts": (("prompt",), ("answer",)),
    "sft": (("prompt", "response"), ()),
    "pairs": (("prompt", "chosen", "rejected"), ()),
}


def read_jsonl(path: str | Path, kind: str) -> list[dict[str, str]]:
    """Records of ``kind`` (prompts | sft | pairs) from ``path``; blank lines are skipped."""
    required, optional = KINDS[kind]
    p = Path(path)
    if not p.is_file():
        raise UserError(f"dataset file not found: {path}")
    out: list[dict[str, str]] = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    for n, line in enumerate(lines, start=1):
        if line.strip():
            if kind == "prompts":
                out.append(_parse_prompt_line(line, f"{path}:{n}"))
            else:
                out.append(_parse_line(line, f"{path}:{n}", required, optional))
    if not out:
        raise UserError(f"dataset {path} has no records")
    return out


def _parse_prompt_line(line: str, where: str) -> dict:
    """A prompt record: "prompt" (or "messages") and "answer" as strings, other fields as they are."""
    rec = _parse_line(line, where, (), ("prompt", "answer"), keep_extra=True)
    if "prompt" not in rec and "messages" not in rec:
        raise UserError(f"{where}: missing key(s) ['prompt']; this dataset needs ['prompt'] (or \"messages\")")
    return rec


def _parse_line(line: str, where: str, required: tuple[str, ...], optional: tuple[str, ...],
                keep_extra: bool = False) -> dict:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise UserError(f"{where}: expected a JSON object with keys {list(required)}, got {type(rec).__name__}")
    missing = [k for k in required if k not in rec]
    if missing:
        raise UserError(f"{where}: missing key(s) {missing}; this dataset needs {list(required)}")
    out = {k: v for k, v in rec.items() if k not in required + optional} if keep_extra else {}
    for k in required + optional:
        if k in rec:
            if not isinstance(rec[k], (str, int, float)) or isinstance(rec[k], bool):
                raise UserError(f"{where}: key {k!r} must be a string, got {type(rec[k]).__name__}")
            out[k] = str(rec[k])
    return out
