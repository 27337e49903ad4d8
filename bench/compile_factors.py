"""torch.compile against eager per decoder layer on this machine, as ``meshrl profile`` measures it
for the planner (meshrl/profile/compile.py): forward, forward + backward and one decoding step,
compiled seconds over eager seconds (below 1: compiling pays), and the one-off compile of each.

    python bench/compile_factors.py [--preset tiny] [--threads 1] [--reps 5] [--seq 128] [--repeat 3]

``--repeat`` measures the factors that many times in one process (the compiles are paid once), so
their spread shows how far one profile's figures can be trusted on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from meshrl.model.presets import get_preset
from meshrl.profile.compile import measure_compile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the profile measures with 1)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence of the forward timings (batch 4)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runs = [measure_compile(args.reps, get_preset(args.preset), seq=args.seq) for _ in range(args.repeat)]
    print(json.dumps({"first": runs[0], **{k: {"median": statistics.median(r[k] for r in runs),
                                               "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)}
                                           for k in ("fwd", "fwd_bwd", "decode")}}, indent=1))


if __name__ == "__main__":
    main()
