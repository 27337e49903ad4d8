"""examples/smollm2/tools: the task generator, the calculator and the environment (no model, no
optional package): the committed splits are the script's, the tool runs sandboxed, and every kind
of reply gets the observation and reward the README describes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from meshrl.algo.env import ToolOutput, load_env

TOOLS = Path(__file__).resolve().parents[2] / "examples" / "smollm2" / "tools"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_committed_splits_are_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, str(TOOLS / "make_task.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    for name in ("train", "eval"):
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (TOOLS / "data" / f"{name}.jsonl").read_bytes()
    train, held = _rows(tmp_path / "train.jsonl"), _rows(tmp_path / "eval.jsonl")
    question = [lambda r: r["messages"][-1]["content"]][0]
    assert not {question(r) for r in train} & {question(r) for r in held}
    for r in train[:20] + held:
        a, op, b = question(r).removeprefix("What is ").removesuffix("?").split()
        assert int(r["answer"]) == (int(a) * int(b) if op == "*" else int(a) + int(b))


def test_the_calculator():
    spec = importlib.util.spec_from_file_location("smollm2_calculator", TOOLS / "calculator.py")
    calc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calc)
    assert calc.calc("347 * 28") == "9716" and calc.calc("(2 + 3) x 4") == "20" and calc.calc("7 / 2") == "3.5"


def test_the_environment():
    env_cls = load_env(f"{TOOLS / 'calc_env.py'}:CalcEnv")
    env = env_cls.make({"answer": "9716"}, "row 0")
    assert env_cls.reset(env, "row 0") is None
    obs, reward, done = env_cls.step(env, "<calc>347 * 28</calc>", "row 0")
    assert isinstance(obs, ToolOutput) and obs.ok and obs == "9716" and (reward, done) == (0.0, False)
    assert env_cls.step(env, "The answer is 9716.", "row 0") == (None, 1.0, True)
    env = env_cls.make({"answer": "9716"}, "row 1")
    obs, _, done = env_cls.step(env, "<calc>347 * import os</calc>", "row 1")
    assert not obs.ok and obs.startswith("error: exit code 1: SyntaxError") and not done
    assert env_cls.step(env, "<calc>1 + 1</calc>", "row 1") == (None, 0.0, True)  # a second call ends it
    env = env_cls.make({"answer": "9716"}, "row 2")
    assert env_cls.step(env, "It is 9715.", "row 2") == (None, 0.0, True)  # answered in the head, wrong
