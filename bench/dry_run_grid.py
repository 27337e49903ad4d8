"""The memory model checked where it matters: predicted against dry-run peak memory per call, on
ReaL's grid and on two MoE presets, at full size on fake tensors (``meshrl plan --dry-run``).

ReaL's grid as bench/real_grid.py plans it (H100 preset, PPO, 2^17 tokens per iteration, prompts of
128 tokens, 4 mini-batches): LLaMA-2 7B / 13B, CodeLLaMA-34B and LLaMA-2 70B on 8 / 16 / 32 / 64 GPUs
("scale actor": actor and reference at that size, critic and reward 7B; "scale critic" the
reverse; "scale both": all four, on twice the GPUs, up to 128), generation of 128 / 384 / 896
tokens; in each cell the heuristic plan and the searched plan. Then qwen3-30b-a3b and mixtral-8x7b
(all four roles) on 64 GPUs. Per call, the busiest rank's predicted peak (the estimator,
Problem.call_memory) against its dry-run peak; the error summary is over every call and simulated
rank of every cell (|predicted - dry run| / dry run).

    python bench/dry_run_grid.py [--scales both] [--models 7B,13B] [--gens 128] [--strategies heuristic,search]
                                 [--steps 200] [--moe] [--moe-presets mixtral-8x7b]
                                 [--out docs/dry_run_grid.md]
    python bench/dry_run_grid.py --merge PART.json [PART.json ...] [--repredict] --out docs/dry_run_grid.md
    python bench/dry_run_grid.py --summary docs/dry_run_grid.md     # the README's table: the page by model

Each run's .json keeps, per cell, its config overrides, the plan and the whole dry-run report (every
simulated rank's measured peak per call), so that ``--merge --repredict`` prices the stored plans
again after an estimator change in seconds; a dry run is needed only where a strategy now picks
another plan.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from real_grid import GENS, SIZES, SMALL  # noqa: E402

from meshrl.commands.plan_dry_run import errors, report  # noqa: E402
from meshrl.config import load_config  # noqa: E402
from meshrl.errors import UserError  # noqa: E402
from meshrl.plan.execution_plan import ExecutionPlan  # noqa: E402
from meshrl.plan.problem import problem_from_config  # noqa: E402
from meshrl.plan.report import compare  # noqa: E402

MOE = (("qwen3-30b-a3b", "Qwen3-30B-A3B"), ("mixtral-8x7b", "Mixtral-8x7B"))


def grid_cells(scales: list[str], models: list[str], gens: list[int]):
    """(setting, model label, GPUs, gen, actor preset, critic preset) of each cell; a cell whose
    models and GPUs equal an earlier one's (7B: scale actor is scale critic) comes once."""
    seen = set()
    for scale in scales:
        for preset, label, gpus in SIZES:
            if label not in models:
                continue
            actor = preset if scale in ("actor", "both") else SMALL
            critic = preset if scale in ("critic", "both") else SMALL
            n = gpus * 2 if scale == "both" else gpus
            for gen in gens:
                if (n, gen, actor, critic) not in seen:
                    seen.add((n, gen, actor, critic))
                    yield f"scale {scale}", label, n, gen, actor, critic


def overrides(actor: str, critic: str, n: int, gen: int) -> list[str]:
    return ["cluster.device=h100-80g", f"cluster.nodes={n // 8}", "cluster.devices_per_node=8",
            f"models.actor={actor}", f"models.ref={actor}", f"models.critic={critic}", f"models.reward={critic}",
            "data.prompt_len=128", f"data.gen_len={gen}", f"data.batch_size={2**17 // (128 + gen)}",
            "ppo.mini_batches=4"]


def run_cell(over: list[str], strategies: list[str], steps: int):
    """[(strategy, plan, dry-run report, seconds)] for one cell: the strategies planned once
    (the search among them), each plan's dry run timed on its own."""
    cfg = load_config(None, over)
    prob = problem_from_config(cfg)
    results, _ = compare(prob, strategies, steps=steps)
    for s in strategies:
        t0 = time.perf_counter()
        rep = report(cfg, prob, results[s].plan, every_rank=False, decode="ends")
        yield s, results[s].plan, rep, time.perf_counter() - t0


def row(setting: str, label: str, n: int, gen: int, strategy: str, plan, rep: dict) -> str:
    cells = []
    for name, c in rep["calls"].items():
        p, m = c["predicted_mem_gib"], c["dry_run_mem_gib"]
        cells.append(f"{name} {p:.1f}/{m:.1f} ({(p - m) / m:+.0%})" if m else f"{name} {p:.1f}/-")
    errs = errors(rep)
    worst = "{} on rank {}: {:.1f}/{:.1f} GiB".format(*worst_pair(rep))
    ok = "ok" if not rep["failures"] else "FAILED: " + rep["failures"][0][:120]
    fits = "fits" if rep["fits"] else "does not fit"
    return (f"| {setting} | {label} | {n} | {gen} | {strategy} | {len(rep['simulated'])} | "
            f"{statistics.median(errs):.1%} / {max(errs):.1%} ({worst}) | " + "; ".join(cells) + f" | {fits}, {ok} |")


def worst_pair(rep: dict) -> tuple[str, int, float, float]:
    """(call, rank, predicted GiB, dry-run GiB) of the (call, simulated rank) pair farthest off."""
    pairs = [(abs(x["predicted_mem_gib"] - x["dry_run_mem_gib"]) / x["dry_run_mem_gib"], name, x["rank"],
              x["predicted_mem_gib"], x["dry_run_mem_gib"])
             for name, c in rep["calls"].items() for x in c["ranks"]
             if x["dry_run_mem_gib"] and x["rank"] == x["simulated_as"]]
    return max(pairs)[1:]


HEAD = ("| setting | model | GPUs | gen | plan | simulated ranks | median / worst error | per call: predicted / "
        "dry-run GiB of the busiest rank (error) | result |")


SUMMARY_HEAD = "| model | GPUs | plans | largest median error of a plan | worst error | fit, checks passed |"
MODELS = ("7B", "13B", "34B", "70B", "Mixtral-8x7B", "Qwen3-30B-A3B")


def summary(rows: list[str]) -> list[str]:
    """The page's rows by model (the README's table): GPU counts, plans, the largest of the plans'
    median errors, the worst (call, rank) error of any plan, and how many plans fit and passed every
    check (collective audit, whole-model and whole-vocabulary checks). Read from the rows themselves,
    so that rows kept without their part file count too."""
    by: dict[str, list[list[str]]] = {}
    for r in rows:
        cols = [c.strip() for c in r.strip().strip("|").split("|")]
        by.setdefault(cols[1], []).append(cols)
    out = [SUMMARY_HEAD, "|---|---|---|---|---|---|"]
    for model in sorted(by, key=lambda m: (MODELS.index(m) if m in MODELS else len(MODELS), m)):
        cells = by[model]
        ran = [c for c in cells if " / " in c[6]]
        med = [float(c[6].split(" / ")[0].rstrip("%")) for c in ran]
        worst = [float(c[6].split(" / ")[1].split("%")[0]) for c in ran]
        good = sum(c[8] == "fits, ok" for c in cells)
        gpus = "/".join(str(g) for g in sorted({int(c[2]) for c in cells}))
        out.append(f"| {model} | {gpus} | {len(cells)} | {max(med, default=0):.1f}% | {max(worst, default=0):.1f}% "
                   f"| {good} of {len(cells)} |")
    return out


def page_rows(page: str) -> list[str]:
    """The grid's rows of a page ``render`` wrote (docs/dry_run_grid.md): the table under HEAD."""
    lines = page.splitlines()
    rows = []
    for ln in lines[lines.index(HEAD) + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(ln)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="actor,critic,both")
    ap.add_argument("--models", default="7B,13B,34B,70B")
    ap.add_argument("--gens", default=",".join(map(str, GENS)))
    ap.add_argument("--strategies", default="heuristic,search")
    ap.add_argument("--steps", type=int, default=200, help="search plan evaluations per cell")
    ap.add_argument("--moe", action="store_true", help="also the MoE presets on 64 GPUs")
    ap.add_argument("--no-grid", action="store_true", help="only the MoE presets")
    ap.add_argument("--moe-presets", default=",".join(p for p, _ in MOE),
                    help="which MoE presets --moe / --no-grid run (comma-separated)")
    ap.add_argument("--out", default="docs/dry_run_grid.md",
                    help="the table (Markdown); its rows and errors also go to the same name with .json")
    ap.add_argument("--merge", nargs="+", metavar="PART.json",
                    help="write --out from the .json of earlier runs (parts of the grid run apart), run nothing")
    ap.add_argument("--summary", metavar="PAGE",
                    help="print the by-model table of a page this script wrote (the README's), run nothing")
    ap.add_argument("--repredict", action="store_true",
                    help="with --merge: price each stored plan again with the estimator as it is now, against its "
                    "stored dry-run peaks (seconds, no dry run)")
    args = ap.parse_args()
    if args.summary:
        print("\n".join(summary(page_rows(Path(args.summary).read_text()))))
        return 0
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        if args.repredict:
            parts = [repredict(p) for p in parts]
        Path(args.out).write_text(render(parts))
        print(render(parts))
        return 0
    strategies = args.strategies.split(",")
    print(HEAD, flush=True)
    rows: list[str] = []
    all_errs: list[float] = []
    t0 = time.perf_counter()
    todo = [] if args.no_grid else list(grid_cells(args.scales.split(","), args.models.split(","),
                                                    [int(g) for g in args.gens.split(",")]))
    if args.moe or args.no_grid:
        wanted = args.moe_presets.split(",")
        unknown = sorted(set(wanted) - {p for p, _ in MOE})
        if unknown:
            ap.error(f"--moe-presets: unknown {unknown[0]!r}; expected some of {[p for p, _ in MOE]}")
        todo += [("MoE", label, 64, 128, preset, preset) for preset, label in MOE if preset in wanted]
    cmd = ("python bench/dry_run_grid.py " + " ".join(sys.argv[1:])).strip()
    cells: list[dict] = []
    for setting, label, n, gen, actor, critic in todo:
        over = overrides(actor, critic, n, gen)
        try:
            for strategy, plan, rep, secs in run_cell(over, strategies, args.steps):
                all_errs += errors(rep)
                rows.append(row(setting, label, n, gen, strategy, plan, rep))
                cells.append({"cell": [setting, label, n, gen], "strategy": strategy, "steps": args.steps,
                              "overrides": over, "plan": plan.to_dict(), "report": rep})
                print(rows[-1], f"({secs:.0f} s)", flush=True)
                write(args.out, {"command": cmd, "rows": rows, "errors": all_errs, "cells": cells,
                                 "seconds": time.perf_counter() - t0, "done": False})
        except UserError as e:  # no plan fits: the cell's row says so
            rows.append(f"| {setting} | {label} | {n} | {gen} | - | - | - | - | {e} |")
            print(rows[-1], flush=True)
    write(args.out, {"command": cmd, "rows": rows, "errors": all_errs, "cells": cells,
                     "seconds": time.perf_counter() - t0, "done": True})
    return 0


def repredict(part: dict) -> dict:
    """``part`` with its rows and errors re-priced by the estimator as it is now: each stored cell's
    plan against its stored dry-run peaks (which the estimator does not change), no dry run.
    A cell whose strategy now chooses another plan is marked: its dry run is of the old plan, and
    only a rerun measures the new one. A part run before cells were stored keeps its rows."""
    if "cells" not in part:
        return part
    rows, errs = [], []
    for c in part["cells"]:
        cfg = load_config(None, c["overrides"])
        prob = problem_from_config(cfg)
        plan = ExecutionPlan.from_dict(c["plan"])
        rep = json.loads(json.dumps(c["report"]))
        for name, per in prob.rank_call_memory(plan).items():
            for x in rep["calls"][name]["ranks"]:
                x["predicted_mem_gib"] = per[x["rank"]] / 2**30
            rep["calls"][name]["predicted_mem_gib"] = max(per.values()) / 2**30
        now = compare(prob, [c["strategy"]], steps=c["steps"])[0][c["strategy"]].plan
        stale = now.calls != plan.calls
        r = row(*c["cell"], c["strategy"], plan, rep)
        rows.append(r[:-2] + "; the strategy now picks another plan, not dry-run yet |" if stale else r)
        errs += errors(rep)
    return {**part, "rows": rows, "errors": errs}


def write(out: str, part: dict) -> None:
    """The table so far to ``out`` and its rows and errors to ``out`` .json (after every cell)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).with_suffix(".json").write_text(json.dumps(part))
    Path(out).write_text(render([part]))


def render(parts: list[dict]) -> str:
    """The Markdown page of one or more runs: every row, the error summary over all of them, the commands."""
    errs = [e for p in parts for e in p["errors"]]
    summary_line = (f"Over {len(errs)} (call, simulated rank) pairs: median |error| {statistics.median(errs):.1%}, "
               f"worst {max(errs):.1%}." if errs else "No cell ran.")
    runs = "\n".join(f"- `{p['command']}` ({len(p['rows'])} rows, {p['seconds']:.0f} s of wall time on a shared "
                      f"machine{'' if p['done'] else '; stopped before its end'}"
                      f"{'; ' + p['note'] if p.get('note') else ''})" for p in parts)
    return ("# Predicted against dry-run peak memory (ReaL's grid, MoE presets)\n\n"
            + "\n".join([HEAD, "|---|---|---|---|---|---|---|---|---|", *[r for p in parts for r in p["rows"]]])
            + f"\n\n{summary_line}\n\nBy model (the README's table):\n\n"
            + "\n".join(summary([r for p in parts for r in p["rows"]]))
            + "\n\nEach cell: one iteration of the plan at full size on fake tensors and fake "
            "process groups (worst case: every response to data.gen_len, no padding removed; decoding's first and "
            "last two steps and each train call's first two optimizer steps; MoE: each token's top-k experts on "
            "the rank), bf16, H100 preset (80 GB). Produced by\n\n" + runs + "\n")


if __name__ == "__main__":
    sys.exit(main())
