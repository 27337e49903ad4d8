"""Tools in a subprocess with limits (meshrl/algo/tool_sandbox.py): a tool that hangs, crashes,
floods its output, spins the CPU or grabs memory comes back as an error observation, quickly."""

from __future__ import annotations

import sys
import time

from meshrl.algo.tool_sandbox import Limits, run_command, run_python_tool

FAST = Limits(timeout_s=2.0, cpu_s=1, memory_mb=256, output_bytes=1000)


def _py(code: str, limits: Limits = FAST):
    return run_command([sys.executable, "-c", code], limits=limits)


def test_a_clean_tool_returns_its_output(tmp_path):
    f = tmp_path / "calc.py"
    f.write_text("def calc(expr):\n    return sum(int(x) for x in expr.split('+'))\n")
    out = run_python_tool(f"{f}:calc", "12+30", FAST)
    assert out == "42" and out.ok


def test_a_hang_is_killed_at_the_timeout():
    t0 = time.monotonic()
    out = _py("import time; time.sleep(60)")
    assert not out.ok and out == "error: timed out after 2 s"
    assert time.monotonic() - t0 < 10


def test_a_crash_names_the_exception():
    out = _py("1/0")
    assert not out.ok and out.startswith("error: exit code 1: ZeroDivisionError")
    seg = _py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert not seg.ok and "signal 11" in seg


def test_a_flood_is_cut_at_the_output_cap():
    out = _py("import sys\nwhile True: sys.stdout.write('x' * 4096)")
    assert not out.ok and out == "error: output over 1000 bytes"


def test_cpu_and_memory_limits():
    spin = _py("while True: pass", Limits(timeout_s=30, cpu_s=1, memory_mb=256, output_bytes=1000))
    assert not spin.ok and spin == "error: CPU time limit (1 s)"
    mem = _py("x = bytearray(1 << 30)")
    assert not mem.ok and "MemoryError" in mem


def test_a_missing_program_is_an_error_observation():
    out = run_command(["/nonexistent/tool"], limits=FAST)
    assert not out.ok and out.startswith("error:")


def test_a_program_is_found_on_the_path():
    out = run_command(["sh", "-c", "cat; echo done"], stdin="in ", limits=FAST)
    assert out.ok and out == "in done"


def test_a_python_tool_that_raises_is_one_line(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("def t(arg):\n    raise ValueError('bad ' + arg)\n")
    out = run_python_tool(f"{f}:t", "input", Limits(timeout_s=5, cpu_s=2, memory_mb=256, output_bytes=64))
    assert not out.ok and out == "error: exit code 1: ValueError: bad input"
