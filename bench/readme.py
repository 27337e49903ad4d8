"""Regenerate (or check) the README's demo block: the lines `meshrl train` prints on the built-in demo.

    python bench/readme.py            # run the demo, rewrite the block between the markers in README.md
    python bench/readme.py --check    # run the demo, exit 1 (with a diff) if README.md's block differs

The block keeps every line the run prints except the per-iteration ones, of which it keeps every
tenth and the last (the console shows all of them). The run's output directory is shown as
runs/demo (the default --out). The figures are deterministic for a fixed seed: the same code gives
the same block on any machine whose CPU kernels sum in the same order. That order follows torch's CPU
capability (``torch.backends.cpu.get_cpu_capability()``: its own kernels) and the CPU's vendor and
matrix units (the kernels oneMKL and oneDNN pick: an AVX512 Intel Xeon and an AVX512 AMD EPYC print
different figures). The block records the three (``machine_kind()``), and the check
(tests/commands/test_readme_demo.py) runs only on a machine of that kind.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- demo:begin", "<!-- demo:end -->"
EVERY = 10


def machine_kind() -> str:
    """'<torch CPU capability> <vendor>[ AMX]', e.g. 'AVX512 GenuineIntel AMX', 'AVX512 AuthenticAMD'."""
    import platform

    import torch

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    vendor = next((v.strip() for k, _, v in (x.partition(":") for x in lines) if k.strip() == "vendor_id"),
                  platform.processor() or platform.machine())
    amx = " AMX" if torch.cpu._is_amx_tile_supported() else ""  # as meshrl/model/decode_weights.py asks
    return f"{torch.backends.cpu.get_cpu_capability()} {vendor}{amx}"


def demo_output(extra: list[str] | None = None) -> list[str]:
    """The lines of a fresh `meshrl train --no-progress` on the demo (in a temporary --out)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        # the demo at the user's defaults: without the suite's float32 pin (tests/conftest.py)
        env = {**{k: v for k, v in os.environ.items() if k != "MESHRL_CPU_BF16"}, "PYTHONPATH": str(ROOT)}
        got = subprocess.run([sys.executable, "-m", "meshrl.cli", "train", "--out", str(out), "--no-progress",
                              *(extra or [])], capture_output=True, text=True, env=env, cwd=tmp)
        if got.returncode != 0:
            raise SystemExit(f"meshrl train failed ({got.returncode}):\n{got.stdout}\n{got.stderr}")
        return [line.replace(str(out), "runs/demo") for line in got.stdout.splitlines()]


def abridge(lines: list[str]) -> list[str]:
    """Every line but the iteration lines, of which every EVERY-th and the last."""
    its = [i for i, line in enumerate(lines) if re.match(r"it +\d+ \|", line)]
    last = its[-1] if its else -1
    keep = []
    for i, line in enumerate(lines):
        m = re.match(r"it +(\d+) \|", line)
        if m is None or int(m.group(1)) % EVERY == 0 or i == last:
            keep.append(line)
    return keep


def block_of(text: str) -> tuple[str, list[str]]:
    """README text -> (the machine kind recorded in the block's marker, the block's lines)."""
    start = text.index(BEGIN)
    head_end = text.index("-->", start)
    kind = text[start + len(BEGIN):head_end].strip().removeprefix("cpu=").strip()
    body = text[head_end + 3:text.index(END)]
    lines = [line for line in body.splitlines() if not line.startswith("```")]
    return kind, [line for line in lines if line.strip()]


def with_block(text: str, lines: list[str], kind: str) -> str:
    start, stop = text.index(BEGIN), text.index(END)
    block = f"{BEGIN} cpu={kind} -->\n```text\n" + "\n".join(lines) + "\n```\n"
    return text[:start] + block + text[stop:]


def comparable(lines: list[str]) -> list[str]:
    """The lines that must match: all but the thread count (it follows the machine's cores and does not
    change the figures) and the compile choice's reasons (they follow the machine's profile; a choice
    that compiles changes the figures, which the other lines then show)."""
    return [line for line in lines if not line.startswith(("threads:", "compile:"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of rewriting README.md")
    args = ap.parse_args()
    readme = ROOT / "README.md"
    text = readme.read_text()
    lines = abridge(demo_output())
    if not args.check:
        kind = machine_kind()
        readme.write_text(with_block(text, lines, kind))
        print(f"README.md: demo block rewritten ({len(lines)} lines, cpu={kind})")
        return 0
    _, have = block_of(text)
    if comparable(have) == comparable(lines):
        print("README.md's demo block equals a fresh run's lines")
        return 0
    sys.stdout.writelines(difflib.unified_diff([x + "\n" for x in have], [x + "\n" for x in lines],
                                               "README.md", "fresh run"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
