"""``meshrl check parallel``: run the model under every layout that fits N local ranks (and on a
sub-mesh that does not start at rank 0) and compare it with one process.

    meshrl check parallel --nprocs 4 [--model PRESET|DIR] [--layout dp2tp2pp1@0-3 ...] [--json]

Compared per layout: logits, per-token log-probs, loss and gradients of a training step, parameters
after two AdamW steps (ZeRO-1, clipped), and greedy and seeded sampled generations; see
meshrl/parallel/verify.py.
Exit status: 0 if every layout is within tolerance, 1 if any is not, 2 for bad input (found before
any rank starts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import UserError
from ..layout.mesh import Placement
from ..layout.shardmap import check_shardable
from ..runtime.launch import RankError, RankPool


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check", help="check this machine: parallel layouts against one process")
    sub = p.add_subparsers(dest="what", metavar="WHAT", required=True, help="what to check")
    q = sub.add_parser("parallel", help="every dp x tp x pp layout on N local ranks vs one process")
    q.add_argument("--nprocs", type=int, required=True, help="local ranks to start")
    q.add_argument("--model", default="tiny", help="model preset (default: tiny) or checkpoint directory")
    q.add_argument("--layout", action="append", metavar="LAYOUT@RANKS",
                   help="check only these placements (repeatable), e.g. dp2tp2pp1@0-3")
    q.add_argument("--seed", type=int, default=0, help="seed of the probe model and batch (default 0)")
    q.add_argument("--timeout", type=float, default=300.0, help="seconds a layout may take")
    q.add_argument("--json", action="store_true", help="print one JSON object")


def layouts_of_size(n: int) -> list[tuple[int, int, int]]:
    """Every (dp, tp, pp) with dp * tp * pp == n."""
    return [(d, t, n // (d * t)) for d in range(1, n + 1) if n % d == 0
            for t in range(1, n // d + 1) if (n // d) % t == 0]


def default_placements(nprocs: int) -> list[str]:
    """Every layout of all N ranks, then every layout of a sub-mesh of the last ranks (N/2 of them,
    or N-1 when N is odd), which does not start at rank 0."""
    out = [f"dp{d}tp{t}pp{p}@0-{nprocs - 1}" for d, t, p in layouts_of_size(nprocs)]
    if nprocs > 1:
        size = nprocs // 2 if nprocs % 2 == 0 else nprocs - 1
        start = nprocs - size
        rng = f"{start}-{nprocs - 1}" if size > 1 else str(start)
        out += [f"dp{d}tp{t}pp{p}@{rng}" for d, t, p in layouts_of_size(size)]
    return out


def _validate(args: argparse.Namespace) -> tuple[object, list[str], list[tuple[str, str]]]:
    """-> (probe, placements to run, [(placement, why skipped)]). Raises UserError on bad input."""
    from ..parallel.verify import Probe  # lazy: --help and `meshrl plan` load no torch

    if args.nprocs < 1:
        raise UserError(f"--nprocs must be >= 1, got {args.nprocs}")
    if not args.timeout > 0:
        raise UserError(f"--timeout must be > 0 seconds, got {args.timeout}")
    probe = Probe(model=args.model, seed=args.seed)
    cfg = probe.config()  # a bad preset / directory fails here with its own message
    run, skipped = [], []
    for text in args.layout or default_placements(args.nprocs):
        placement = Placement.parse(text)
        placement.mesh.check_world(args.nprocs)
        try:
            check_shardable(cfg, placement)
        except UserError as e:
            if args.layout:  # asked for explicitly: an error, not a skip
                raise UserError(f"layout {text}: {e}") from None
            skipped.append((text, str(e)))
            continue
        run.append(str(placement))
    return probe, run, skipped


def run(args: argparse.Namespace) -> int:
    probe, placements, skipped = _validate(args)
    from ..parallel.verify import TOLERANCE, run_layout, summarize  # lazy: --help and `meshrl plan` load no torch

    results = []
    try:
        with RankPool(args.nprocs, timeout=args.timeout) as pool:
            for text in placements:
                t0 = time.monotonic()
                rec = summarize(text, pool.run(run_layout, probe, text))
                rec["seconds"] = round(time.monotonic() - t0, 2)
                results.append(rec)
                if not args.json:
                    _print_row(rec)
    except RankError as e:
        print(f"meshrl check: a rank failed: {e}", file=sys.stderr)
        return 1
    ok = bool(results) and all(r["ok"] for r in results)  # no layout run is no evidence
    if args.json:
        print(json.dumps({"model": args.model, "tolerance": TOLERANCE, "results": results,
                          "skipped": [{"placement": p, "reason": why} for p, why in skipped], "ok": ok}))
    else:
        for p, why in skipped:
            print(f"skipped {p}: {why}")
        print(f"{'all layouts match' if ok else 'MISMATCH'}: {sum(r['ok'] for r in results)}/{len(results)} "
              f"within relative difference {TOLERANCE:g}, with equal greedy and sampled generations")
    return 0 if ok else 1


def _print_row(r: dict) -> None:
    ranks = r["ranks"]
    where = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    print(f"{r['layout']:>11}@{where:<5} logits {_num(r['logits_max_rel_diff'])}  logprobs "
          f"{_num(r['logprobs_max_rel_diff'])}  grads {_num(r['grads_max_rel_diff'])}  params "
          f"{_num(r['params_max_rel_diff'])}  greedy {'equal' if r['generate_equal'] else 'DIFFERENT'}  "
          f"sampled {'equal' if r['sample_equal'] else 'DIFFERENT'}  "
          f"{'ok' if r['ok'] else 'FAIL'}  ({r['seconds']:.1f} s)", flush=True)
    for what in r.get("missing", []):
        print(f"    missing: {what}")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"
