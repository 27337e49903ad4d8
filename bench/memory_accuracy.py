"""Predicted against measured peak memory per call (`meshrl plan --validate --json`), over strategies
on 2 and 4 local gloo ranks, with the median and worst |error| over the modelled calls (target:
median <= 15%). Memory does not depend on the machine's speed, so any CPU profile will do
(--profile; without one the figures of tests/plan/test_validate.py are written to a temp file).

    python bench/memory_accuracy.py [--ranks 2,4] [--strategies colocated,interleaved,disaggregated]
                                    [--profile FILE] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = ["data.batch_size=8", "data.gen_len=4", "data.prompt_len=8"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--strategies", default="colocated,interleaved,disaggregated")
    ap.add_argument("--profile")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    prof = args.profile
    if prof is None:
        sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "plan"))
        from test_validate import PROFILE

        prof = tempfile.mktemp(suffix=".json")
        Path(prof).write_text(json.dumps(PROFILE))
    errors = []
    for n in args.ranks.split(","):
        for s in args.strategies.split(","):
            cmd = ["meshrl", "plan", "cluster.device=cpu", f"cluster.devices_per_node={n}", *SIZES, *args.overrides,
                   "--strategy", s, "--profile", prof, "--validate", "--validate-iterations", "2", "--json"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            try:
                calls = json.loads(res.stdout.strip().splitlines()[-1])["calls"]
            except (IndexError, KeyError, json.JSONDecodeError):
                print(f"{n} ranks {s}: failed\n{res.stdout[-500:]}{res.stderr[-2000:]}")
                continue
            row = []
            for name, c in calls.items():
                p, m = c["predicted_mem_gib"], c["measured_mem_gib"]
                err = (p - m) / m
                if c["modelled"]:
                    errors.append(abs(err))
                row.append(f"{name} {p * 1024:.1f}/{m * 1024:.1f} MiB {err:+.0%}")
            print(f"{n} ranks {s:13s} " + ", ".join(row), flush=True)
    if errors:
        print(f"memory: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%} "
              f"over {len(errors)} calls (predicted/measured per call above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
