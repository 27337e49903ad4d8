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
    p.add_argument("--validate", action="store_true", help="run the chosen plan on this machine's CPU ranks "
                   "(cluster.device=cpu) and print predicted against measured time per call and iteration")
    p.add_argument("--validate-iterations", type=int, default=3, metavar="N",
                   help="iterations run by --validate; the first is a warm-up and is not compared (default 3)")
    p.add_argument("--max-ranks", type=int, default=8, metavar="N",
                   help="the most local ranks --validate may start (default 8)")


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
    if args.validate:
        check_validate(cfg, args)
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
    if args.json and args.validate:
        return validate(cfg, problem, res.plan, args.validate_iterations, args.max_ranks, as_json=True)
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
    if args.validate:
        return validate(cfg, problem, res.plan, args.validate_iterations, args.max_ranks)
    return 0


def check_validate(cfg, args: argparse.Namespace) -> None:
    """--validate's own input errors, before any planning or rank starts."""
    if cfg.cluster.device != "cpu":
        raise UserError(f"--validate runs the plan on this machine's CPU ranks and needs cluster.device=cpu "
                        f"(got {cfg.cluster.device!r})")
    if args.max_ranks < 1:
        raise UserError(f"--max-ranks must be >= 1, got {args.max_ranks}")
    world = cfg.cluster.nodes * cfg.cluster.devices_per_node
    if world > args.max_ranks:
        raise UserError(f"--validate: the plan needs {world} ranks (cluster.nodes x cluster.devices_per_node), "
                        f"more than the {args.max_ranks} local ranks allowed (--max-ranks)")
    if args.validate_iterations < 2:
        raise UserError(f"--validate-iterations must be >= 2 (iteration 0 is a warm-up), "
                        f"got {args.validate_iterations}")


def validate(cfg, problem, plan, iterations: int, max_ranks: int, as_json: bool = False) -> int:
    """Run ``plan`` here and print predicted against measured seconds (and peak memory) per step and
    per iteration; 1 if a rank failed (the message names the rank and the step). ``as_json``: one
    JSON object (plan/validate.py to_json) and nothing else on stdout."""
    from ..plan.validate import compare, memory, memory_summary, table, to_json
    from ..runtime.validate import rule_calls, run_plan

    if as_json:
        try:
            records = run_plan(cfg, plan, iterations, max_ranks)
        except RuntimeError as e:
            print(json.dumps({"error": str(e)}))
            return 1
        rows = compare(problem, plan, records, rule_calls(cfg, plan))
        print(json.dumps(to_json(rows, memory(problem, plan, records))))
        return 0
    print(f"\nvalidating: running the plan on {plan.cluster.size} local gloo rank(s) for {iterations} iterations "
          "(iteration 0 is a warm-up; medians of the others; no SFT warm-up, so generation runs to data.gen_len)",
          flush=True)
    try:
        records = run_plan(cfg, plan, iterations, max_ranks)
    except RuntimeError as e:
        print(f"meshrl plan: the validation run failed and was stopped: {e}")
        return 1
    rows = compare(problem, plan, records, rule_calls(cfg, plan))
    print(table(rows))
    mem = memory(problem, plan, records)
    print("\npeak memory per call (busiest rank): " + ", ".join(
        f"{n} {p:.3f}/{m:.3f} GiB" for n, (p, m) in mem.items()) + " (predicted/measured)")
    med, worst = memory_summary(mem)
    print(f"memory: median |error| {med:.0%}, worst {worst:.0%}")
    if rule_calls(cfg, plan):
        print(f"({', '.join(rule_calls(cfg, plan))}: a rule reward, no model; the estimator prices a model there)")
    return 0
