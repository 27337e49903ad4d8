"""The environment of the tool example (env.fn=examples/smollm2/tools/calc_env.py:CalcEnv).

A trajectory is at most two policy turns. A reply holding ``<calc>EXPRESSION</calc>`` is a tool
call: the calculator (calculator.py) runs in a sandboxed subprocess and its result, or its error,
is the observation, as the next user turn. Any other reply is the final answer: reward 1 when its
last number is the record's answer, else 0. A second tool call ends the trajectory unrewarded."""

from __future__ import annotations

import re
from pathlib import Path

from meshrl.algo.env import tagged_call
from meshrl.algo.tool_sandbox import Limits, run_python_tool

TOOL = f"{Path(__file__).with_name('calculator.py')}:calc"
LIMITS = Limits(timeout_s=20.0, cpu_s=5, memory_mb=512, output_bytes=256)


def last_number(text: str) -> str | None:
    nums = re.findall(r"-?\d[\d,]*", text)
    return nums[-1].replace(",", "") if nums else None


class CalcEnv:
    def __init__(self, row: dict) -> None:
        self.answer, self.calls = str(row["answer"]), 0

    def reset(self) -> None:
        return None  # the record's own prompt (its system turn explains the tool)

    def step(self, response: str):
        call = tagged_call(response, "calc")
        if call is not None:
            self.calls += 1
            if self.calls > 1:
                return None, 0.0, True
            return run_python_tool(TOOL, call, LIMITS), 0.0, False
        return None, float(last_number(response) == self.answer), True
