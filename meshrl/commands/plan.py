"""``meshrl plan [CONFIG.yaml] [key=value ...]``: predict (and search) where every call runs.

Prints, for the chosen plan, one row per call (mesh, layout, micro-batches, predicted time and
memory), then every strategy's iteration time, PFLOP/s and peak memory, and why the chosen plan
wins. ``data.batch_size`` is prompts per iteration: ReaL's 2^17 tokens per iteration with 128 + 384
tokens per sequence is batch_size=256.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..plan.compile_choice import NO_PROFILE, choose_for_config
from ..plan.search import DEFAULT_STEPS
from ..plan.fallback import planning_problem
from ..plan.problem import problem_from_config
from ..plan.report import NAMES, comparison_table, compare, compile_line, explain, plan_table
from .train import run_config, split_items
from ..plan.lengths import apply_lengths
from dataclasses import replace
from ..plan.simulator import iteration_time
from ..plan.lag import choose_lag, with_lag
from ..plan import validate as measured
from ..plan.calibrate import read_run, refit, scales_table
from . import plan_dry_run


BARE_HINT = ("(no config given: the built-in demo's models on this machine's one device; to plan a cluster, "
             "name it, e.g. meshrl plan cluster.device=h100-80g cluster.nodes=8 cluster.devices_per_node=8 "
             "models.actor=llama2-70b models.ref=llama2-70b models.critic=llama2-7b models.reward=llama2-7b)")


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
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help=f"search budget in plan evaluations (default {DEFAULT_STEPS}); with --seed it fixes the "
                   "plan: the same command gives the same plan on any machine")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="optional wall-clock cap on the search (then the plan can depend on the machine's speed)")
    p.add_argument("--seed", type=int, default=0, help="search random seed (default 0)")
    p.add_argument("--profile", metavar="FILE", help="measured profile for cluster.device=cpu "
                   "(default $MESHRL_PROFILE or ~/.cache/meshrl/profile-cpu.json)")
    p.add_argument("--calibrate", metavar="OUT/", help="refit each call's cost from the run in OUT/ (its "
                   "config.yaml, plan.json, metrics.jsonl), print predicted against measured per call, re-plan")
    p.add_argument("--lengths-from", metavar="OUT/", help="price responses at the lengths an earlier run "
                   "measured (its metrics.jsonl: response/length, response/length_max) instead of data.gen_len")
    p.add_argument("--save", metavar="FILE.json", help="write the chosen plan here (meshrl train --plan FILE)")
    p.add_argument("--validate", action="store_true", help="run the chosen plan on this machine's CPU ranks "
                   "(cluster.device=cpu) and print predicted against measured time per call and iteration")
    p.add_argument("--validate-iterations", type=int, default=3, metavar="N",
                   help="iterations run by --validate; the first is a warm-up and is not compared (default 3)")
    p.add_argument("--dry-run", action="store_true", help="execute one iteration of the chosen plan at full size "
                   "on fake tensors and a fake process group here (every rank's memory and collectives, audited)")
    p.add_argument("--dry-run-ranks", choices=("classes", "all"), default="classes",
                   help="simulate one rank per symmetry class and a checking member (default), or every rank")
    p.add_argument("--dry-run-decode", choices=("ends", "all"), default="ends",
                   help="decoding steps the dry run executes: the first and last two (default; and a train "
                   "call's first two optimizer steps) or all")
    p.add_argument("--max-ranks", type=int, default=8, metavar="N",
                   help="the most local ranks --validate may start (default 8)")


def run(args: argparse.Namespace) -> int:
    from .settings import load_settings  # lazy: --help and `meshrl plan` load no torch

    steps = DEFAULT_STEPS if args.steps is None else args.steps
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    if args.time_limit is not None and not args.time_limit > 0:
        raise UserError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    names = list(NAMES) if args.strategy == "all" else [args.strategy]
    if names[0] not in NAMES:
        raise UserError(f"unknown strategy {args.strategy!r}; known: {', '.join(NAMES)}, all")
    config, overrides = split_items(args.items)
    if args.calibrate:
        if config:
            raise UserError(f"--calibrate reads the run's own config ({args.calibrate}/config.yaml); "
                            f"drop {config} (key=value overrides are allowed)")
        return calibrate(args, names, overrides, steps)
    cfg = load_settings(config, overrides)
    if config is None and cfg.data.path is None and cfg.models == type(cfg.models)():
        cfg, _ = run_config(config, overrides)  # the demo's models: plan the demo's sizes, as it trains
    if args.validate:
        check_validate(cfg, args)
    if args.dry_run and args.validate:
        raise UserError("--dry-run and --validate are two runs of the plan: give one")
    if args.lengths_from:
        mean, longest = apply_lengths(cfg, args.lengths_from)
        if not args.json:
            print(f"response lengths from {args.lengths_from}: mean {mean:.1f}, longest of a batch "
                  f"{'not recorded (taken as data.gen_len)' if longest is None else f'{longest:.1f}'} "
                  f"(data.gen_len = {cfg.data.gen_len})")
            if cfg.env.fn:
                print(f"multi-turn: {cfg.data.turns_mean:.2f} turns per trajectory (per turn above), "
                      f"{cfg.data.obs_len_mean:.1f} tokens per observation")
    # --validate compares with this machine, so it needs its measured profile; otherwise the
    # planner's one fallback for a CPU without one (meshrl/plan/fallback.py, as `train --nprocs`)
    if args.validate:
        problem, note = problem_from_config(cfg, args.profile), ""
    else:
        problem, note = planning_problem(cfg, args.profile)
    cpu0 = time.process_time()
    problem, results, search_s, lag = plan_all(problem, names, steps, args)
    cpu_s = time.process_time() - cpu0  # the planning's own cost; the wall time grows with the load
    cfg = with_lag(cfg, problem.off_policy) if lag is not None else cfg  # auto: --validate / --dry-run's lag
    chosen = "search" if "search" in results else names[0]
    res = results[chosen]
    for path in (args.trace, args.gantt, args.save):
        if path and Path(path).parent and not Path(path).parent.exists():
            raise UserError(f"cannot write {path}: directory {Path(path).parent} does not exist")
    wrote = []
    if args.trace:
        Path(args.trace).write_text(json.dumps(res.timeline.to_chrome_trace()))
        wrote.append(f"wrote {args.trace}: the {chosen} plan's simulated iteration as a Chrome trace "
                     "(open it in https://ui.perfetto.dev)")
    if args.gantt:
        res.timeline.save_gantt(args.gantt)
        wrote.append(f"wrote {args.gantt}: the {chosen} plan's Gantt chart")
    if args.save:
        Path(args.save).write_text(res.plan.to_json())
        wrote.append(f"wrote {args.save}: the {chosen} plan (meshrl train --plan {args.save})")
    for line in ([note] if note else []) + (wrote if args.json else []):  # --json: stdout holds only JSON
        print(line, file=sys.stderr if args.json else sys.stdout)
    if not args.items and not args.json:
        print(BARE_HINT)
    if args.json and args.validate:
        return validate(cfg, problem, res.plan, args.validate_iterations, args.max_ranks, as_json=True)
    if args.dry_run:
        if not args.json:
            print(f"plan: {chosen}")
            print(plan_table(problem, res.plan))
            print(f"\ndry run: one iteration of the {chosen} plan on {res.plan.cluster.size} fake ranks ...",
                  flush=True)
        return plan_dry_run.run(cfg, problem, res.plan, args.json, args.dry_run_ranks == "all", args.dry_run_decode)
    by_k = off_policy_times(problem, results)
    if args.json:
        lags = {"train.off_policy": problem.off_policy, "iteration_s_by_k": {str(k): v for k, v in by_k.items()}}
        if lag is not None:  # auto: each lag's own plan, and the lag chosen
            lags |= {"auto": True, "auto_s_by_k": {str(k): v for k, v in lag.seconds.items()}}
        print(json.dumps({"strategies": {n: {**r.to_dict(), "off_policy": problem.off_policy}
                                         for n, r in results.items()}, "search_s": search_s, "off_policy": lags}))
        return 0
    c = problem.cluster
    device = problem.hw.name if problem.hw.name == problem.hw.device else f"cpu with {problem.hw.name} costs"
    print(f"{cfg.algo} on {c.nodes} x {c.devices_per_node} {device} "
          f"({problem.hw.mem_bytes / 2**30:.0f} GiB each); {problem.shape.batch_size} prompts x "
          f"{problem.shape.samples_per_prompt} samples, {problem.shape.prompt_len} + {problem.shape.gen_len} tokens"
          + (f"; generation {problem.off_policy} iteration(s) ahead (train.off_policy={problem.off_policy})"
             if problem.off_policy else ""))
    if priced := compile_line(problem):
        print(priced)
    print(f"\nplan: {chosen}")
    print(plan_table(problem, res.plan))
    print()
    print(comparison_table(results))
    if search_s:
        print(f"(search: {steps} steps, seed {args.seed}: {search_s:.1f} s; planning took {cpu_s:.1f} s of CPU time)")
    print()
    print(explain(problem, results, chosen))
    print(off_policy_line(problem, by_k) if lag is None else lag.line())
    if "auto" in (cfg.train.compile, cfg.gen.compile):  # what `meshrl train` would choose (plan/compile_choice.py)
        print(choose_for_config(cfg, problem, res.plan, NO_PROFILE if note else "").line())
    for line in wrote:
        print(line)
    if args.validate:
        return validate(cfg, problem, res.plan, args.validate_iterations, args.max_ranks)
    return 0


OFF_POLICY_KS = (0, 1, 2, 4)  # the lags `meshrl plan` prices beside the config's own


def plan_all(problem, names: list[str], steps: int, args: argparse.Namespace):
    """(problem, each strategy's Result, the search's seconds, LagChoice or None): the plans of
    ``names``; under train.off_policy=auto found again for each lag, and the problem returned at
    the lag chosen for the plan `meshrl plan` shows (the search's, else the one strategy's)."""
    if problem.off_policy_max is None:
        return (problem, *compare(problem, names, steps, args.seed, args.time_limit), None)
    found = {}

    def plan_for(at_k):
        results, search_s = compare(at_k, names, steps, args.seed, args.time_limit)
        found[at_k.off_policy] = (at_k, results, search_s)
        return results["search" if "search" in results else names[0]].plan

    lag = choose_lag(problem, plan_for)
    return (*found[lag.k], lag)


def off_policy_times(problem, results: dict) -> dict[int, dict[str, float]]:
    """k -> each feasible strategy's plan priced with train.off_policy=k (generation k iterations
    ahead), for the config's k and OFF_POLICY_KS; the plans are kept as they are."""

    ks = sorted({*OFF_POLICY_KS, problem.off_policy})
    return {k: {n: iteration_time(replace(problem, off_policy=k), r.plan) for n, r in results.items() if r.feasible}
            for k in ks}


def off_policy_line(problem, by_k: dict[int, dict[str, float]]) -> str:
    """One line: the best plan's predicted iteration time at each lag k, and its gain over k = 0."""
    if not by_k[0]:
        return "train.off_policy: no strategy's plan fits, nothing to compare"
    best = {k: min(times.items(), key=lambda kv: kv[1]) for k, times in by_k.items()}
    base = best[0][1]
    parts = [f"k={k}{' (this run)' if k == problem.off_policy else ''} {s:.3g} s ({name}"
             + (f", {base / s:.2f}x" if k else "") + ")" for k, (name, s) in best.items()]
    head = "train.off_policy=k (generation k iterations ahead, from weights k updates old: the config's " \
           "choice, it changes results), best plan at each k: "
    if all(base / s < 1.005 for _, s in best.values()):
        return head + " | ".join(parts) + "; no lag would save time here"
    return head + " | ".join(parts)


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
    from ..runtime.validate import run_plan  # lazy: --help and `meshrl plan` load no torch

    if as_json:
        try:
            records = run_plan(cfg, plan, iterations, max_ranks)
        except RuntimeError as e:
            print(json.dumps({"error": str(e)}))
            return 1
        rows = measured.compare(problem, plan, records, measured.rule_calls(cfg, plan))
        print(json.dumps(measured.to_json(rows, measured.memory(problem, plan, records))))
        return 0
    print(f"\nvalidating: running the plan on {plan.cluster.size} local gloo rank(s) for {iterations} iterations "
          "(iteration 0 is a warm-up; medians of the others; no SFT warm-up, so generation runs to data.gen_len)",
          flush=True)
    try:
        records = run_plan(cfg, plan, iterations, max_ranks)
    except RuntimeError as e:
        print(f"meshrl plan: the validation run failed and was stopped: {e}")
        return 1
    rows = measured.compare(problem, plan, records, measured.rule_calls(cfg, plan))
    print(measured.table(rows))
    mem = measured.memory(problem, plan, records)
    print("\npeak memory per call (busiest rank): " + ", ".join(
        f"{n} {p:.3f}/{m:.3f} GiB" for n, (p, m) in mem.items()) + " (predicted/measured)")
    med, worst = measured.memory_summary(mem)
    print(f"memory: median |error| {med:.0%}, worst {worst:.0%}")
    if measured.rule_calls(cfg, plan):
        calls = ", ".join(measured.rule_calls(cfg, plan))
        print(f"({calls}: a rule reward, no model; the estimator prices a model there)")
    return 0


def calibrate(args: argparse.Namespace, names: list[str], overrides: list[str], steps: int) -> int:
    """--calibrate OUT/: the run's plan priced before and after refitting each call's cost from the
    run's measurements, then the strategies and the search under the refitted costs."""
    from .settings import load_settings  # lazy: --help and `meshrl plan` load no torch

    cfg_path, run_plan, records = read_run(args.calibrate)
    cfg = load_settings(str(cfg_path), overrides)
    c = run_plan.cluster  # the plan knows the cluster the run had (a --nprocs run's config may not)
    cfg.cluster.nodes, cfg.cluster.devices_per_node, cfg.cluster.device = c.nodes, c.devices_per_node, c.device
    if args.lengths_from:
        apply_lengths(cfg, args.lengths_from)
    problem = problem_from_config(cfg, args.profile)  # the run's own train.off_policy
    unmodelled = measured.rule_calls(cfg, run_plan)
    fit = refit(problem, run_plan, records, unmodelled)
    before = fit.rows[-1].predicted
    print(f"run in {args.calibrate}: {len(records)} iterations of plan '{run_plan.strategy}' on {c.size} "
          f"{c.device} ranks; predicted (before the refit) against measured, medians after iteration 0:")
    print(measured.table(fit.rows))
    print("\nrefitted cost per call (measured / predicted), applied to every layout the search tries:")
    print(scales_table(fit.scales))
    results, search_s = compare(fit.problem, names, steps, args.seed, args.time_limit)
    chosen = "search" if "search" in results else names[0]
    res = results[chosen]
    now = fit.run_plan_s(run_plan)
    print(f"\nthe run's plan under the refitted costs: {now:.4f} s per iteration (predicted before: {before:.4f}, "
          f"measured: {fit.rows[-1].measured:.4f})")
    print(f"\nre-planned ({chosen}):")
    print(plan_table(fit.problem, res.plan))
    print()
    print(comparison_table(results))
    gain = now / res.iteration_s if res.iteration_s > 0 else float("nan")
    print(f"\n{chosen}: {res.iteration_s:.4f} s per iteration against {now:.4f} s for the run's plan "
          f"(gain {gain:.2f}x, refitted costs)")
    if args.save:
        Path(args.save).write_text(res.plan.to_json())
    return 0

