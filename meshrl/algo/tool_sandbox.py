"""Running a tool safely: a subprocess with a wall-clock timeout and resource limits, whose every
failure becomes an observation the policy reads (``ToolOutput`` with ok=False), never a dead run.

    run_python_tool("tools.py:calc", "12*34")          # a function of a file (or module:function)
    run_command(["python3", "-c", "print(1)"], stdin="")  # any program

Limits (``Limits``), set in the child by a small launcher before it ``exec``s the tool (so nothing
runs between fork and exec in this possibly multi-threaded process):

- address space (RLIMIT_AS, ``memory_mb``): an allocation beyond it fails in the tool (MemoryError);
- CPU seconds (RLIMIT_CPU, ``cpu_s``): a busy loop gets SIGXCPU, then SIGKILL;
- output: stdout and stderr go to files capped by RLIMIT_FSIZE (``output_bytes``): a flood gets
  SIGXFSZ and at most that many bytes are ever read back;
- wall clock (``timeout_s``): a tool that sleeps or blocks is killed with its process group;
- it starts in a process group of its own (setsid) in an empty temporary directory, with
  OMP_NUM_THREADS=1.

Each outcome is one line the policy can read: "error: timed out after 5 s", "error: output over
4096 bytes", "error: CPU time limit (2 s)", "error: exit code 1: ZeroDivisionError: division by zero".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .env import ToolOutput


@dataclass(frozen=True)
class Limits:
    """What one tool run may use."""

    timeout_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 4096

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "output_bytes"):
            if getattr(self, name) <= 0:
                raise UserError(f"tool limit {name} must be > 0, got {getattr(self, name)}")


# Runs in the child: set the limits, call setsid (a process group of its own), then become the tool.
_LAUNCH = """
import os, resource, sys
lim = {lim}
resource.setrlimit(resource.RLIMIT_AS, (lim["as"], lim["as"]))
resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execvp(sys.argv[1], sys.argv[1:])
"""

# A Python function as a program: argv = file.py|module, function name; the argument on stdin. An
# exception is one line on stderr ("ValueError: ..."), not a traceback the output cap would cut.
_PY_TOOL = """
import importlib, importlib.util, sys
target, name = sys.argv[1], sys.argv[2]
try:
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location("meshrl_tool", target)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(target)
    out = getattr(mod, name)(sys.stdin.read())
except Exception as e:
    sys.stderr.write(type(e).__name__ + ": " + str(e).replace(chr(10), " "))
    sys.exit(1)
sys.stdout.write(str(out))
"""


def run_command(argv: list[str], stdin: str = "", limits: Limits = Limits()) -> ToolOutput:
    """Run ``argv`` under ``limits`` with ``stdin`` -> its stdout (ok) or one error line (not ok)."""
    lim = {"as": limits.memory_mb << 20, "cpu": int(limits.cpu_s), "fsize": int(limits.output_bytes)}
    launcher = [sys.executable, "-S", "-c", _LAUNCH.format(lim=json.dumps(lim)), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="meshrl-tool-") as cwd:
        out_path, err_path = Path(cwd, ".stdout"), Path(cwd, ".stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(launcher, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env,
                                        start_new_session=True)
            except OSError as e:
                return ToolOutput(f"error: cannot start the tool: {e.strerror}", ok=False)
            timed_out = _wait(proc, stdin, limits.timeout_s)
        stdout = _read(out_path, limits.output_bytes)
        stderr = _read(err_path, limits.output_bytes)
    return _outcome(proc.returncode, timed_out, stdout, stderr, limits)


def _wait(proc: subprocess.Popen, stdin: str, timeout_s: float) -> bool:
    """Feed stdin, wait up to timeout_s; kill the tool's process group if it is still running."""
    try:
        proc.communicate(stdin.encode(), timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        pass
    except BrokenPipeError:  # the tool exited without reading its input
        proc.wait(timeout=timeout_s)
        return False
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return True


def _read(path: Path, cap: int) -> str:
    with open(path, "rb") as f:
        return f.read(cap).decode("utf-8", errors="replace")


def _outcome(code: int, timed_out: bool, stdout: str, stderr: str, limits: Limits) -> ToolOutput:
    """The observation of one run: stdout when it exited 0, else the one line naming what failed."""
    if timed_out:
        return ToolOutput(f"error: timed out after {limits.timeout_s:g} s", ok=False)
    if code == -signal.SIGXFSZ or len(stdout.encode()) >= limits.output_bytes:
        return ToolOutput(f"error: output over {limits.output_bytes} bytes", ok=False)
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return ToolOutput(f"error: CPU time limit ({limits.cpu_s} s)", ok=False)
    if code != 0:
        last = [line for line in stderr.strip().splitlines() if line.strip()]
        why = last[-1][:200] if last else (f"signal {-code}" if code < 0 else "no message")
        return ToolOutput(f"error: exit code {code}: {why}", ok=False)
    return ToolOutput(stdout.strip(), ok=True)


def run_python_tool(spec: str, arg: str, limits: Limits = Limits()) -> ToolOutput:
    """``file.py:function`` or ``module:function``, called as function(arg: str) in a subprocess
    under ``limits``; its return value, as text, is the output."""
    target, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        raise UserError(f"tool {spec!r}: expected path/to/file.py:function or package.module:function")
    if target.endswith(".py"):
        if not Path(target).is_file():
            raise UserError(f"tool {spec!r}: file {target} not found")
        target = str(Path(target).resolve())
    return run_command([sys.executable, "-c", _PY_TOOL, target, name], stdin=arg, limits=limits)
