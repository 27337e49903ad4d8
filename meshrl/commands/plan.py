"""``meshrl plan [CONFIG.yaml] [key=value ...]``: predict (and search) where every call runs.

Prints, for the chosen plan, one row per call (mesh, layout, micro-batches, predicted time and
memory), then every strategy's iteration time, PFLOP/s and peak memory, and why the chosen plan
wins. ``data.batch_size`` is prompts per iteration: ReaL's 2^17 tokens per iteration with 128 + 384
tokens per sequence is batch_size=256.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UserError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="estimate or search an execution plan for the config's cluster",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value",
                   help="an optional YAML config first, then dotted overrides such as cluster.nodes=2")
    p.add_argument("--strategy", default="all",
                   help="colocated | interleaved | disaggregated | heuristic | search | all (default)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--trace", metavar="FILE", help="write the chosen plan's simulated Chrome trace here")
    p.add_argument("--gantt", metavar="FILE.png", help="write the chosen plan's Gantt chart here")
    p.add_argument("--budget", type=float, default=5.0, help="search time budget in seconds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="search random seed")
    p.add_argument("--async", dest="async_gen", type=int, choices=(0, 1), default=None,
                   help="1: generation runs one iteration ahead of training (one step off-policy)")
    p.add_argument("--profile", metavar="FILE", help="measured profile for cluster.device=cpu "
                   "(default $MESHRL_PROFILE or ~/.cache/meshrl/profile-cpu.json)")
    p.add_argument("--save", metavar="FILE.json", help="write the chosen plan here (meshrl train --plan FILE)")


def run(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..plan.problem import problem_from_config
    from ..plan.report import NAMES, comparison_table, compare, explain, plan_table
    from .train import split_items

    if args.budget <= 0:
        raise UserError(f"--budget must be positive, got {args.budget}")
    names = list(NAMES) if args.strategy == "all" else [args.strategy]
    if names[0] not in NAMES:
        raise UserError(f"unknown strategy {args.strategy!r}; known: {', '.join(NAMES)}, all")
    config, overrides = split_items(args.items)
    cfg = load_config(config, overrides)
    problem = problem_from_config(cfg, args.profile, args.async_gen)
    results, search_s = compare(problem, names, args.budget, args.seed)
    chosen = "search" if "search" in results else names[0]
    res = results[chosen]
    for path in (args.trace, args.gantt, args.save):
        if path and Path(path).parent and not Path(path).parent.exists():
            raise UserError(f"cannot write {path}: directory {Path(path).parent} does not exist")
    if args.trace:
        Path(args.trace).write_text(json.dumps(res.timeline.to_chrome_trace()))
    if args.gantt:
        res.timeline.save_gantt(args.gantt)
    if args.save:
        Path(args.save).write_text(res.plan.to_json())
    if args.json:
        print(json.dumps({"strategies": {n: r.to_dict() for n, r in results.items()}, "search_s": search_s}))
        return 0
    c = problem.cluster
    print(f"{cfg.algo} on {c.nodes} x {c.devices_per_node} {problem.hw.name} "
          f"({problem.hw.mem_bytes / 2**30:.0f} GiB each); {problem.shape.batch_size} prompts x "
          f"{problem.shape.samples_per_prompt} samples, {problem.shape.prompt_len} + {problem.shape.gen_len} tokens"
          f"{'; async generation' if problem.async_gen else ''}")
    print(f"\nplan: {chosen}")
    print(plan_table(problem, res.plan))
    print()
    print(comparison_table(results))
    if search_s:
        print(f"(search: {search_s:.1f} s)")
    print()
    print(explain(problem, results, chosen))
    return 0
