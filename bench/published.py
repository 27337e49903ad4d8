"""meshrl's GPU estimates against published measurements (bench/published/rows.json, cited per row).

For every row the estimator prices what the source measured, with the source's sizes and layout:
- decode: one generate call (prefill + decoding) of ``batch`` prompts, tp as published -> output tokens/s;
- prefill: the same with one output token -> first-token latency;
- train: one optimizer step of ``gpus x micro_batch x grad_accum`` sequences, dp = gpus -> tokens/s/GPU;
- rlhf: one PPO iteration of the published system, simulated under its strategy (DeepSpeed-Chat: all
  models co-located), times the iterations of one epoch -> hours.
Models that are not LLaMA-shaped (MPT, OPT) are priced as LLaMA-shaped models of the same width,
depth, heads, vocabulary and parameter count (a 4h GELU MLP = a SwiGLU MLP of width 8h/3).

Error = predicted time / measured time - 1 (negative: meshrl is optimistic). ReaL's throughput
figures are not rows: they stay the independent check (docs/planner.md compares them).

    python bench/published.py [--fit] [--holdout]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from meshrl.algo.graph import graph_for
from meshrl.model.config import ModelConfig
from meshrl.model.presets import get_preset
from meshrl.layout.mesh import Layout, Mesh
from meshrl.plan.estimator import CallSpec, RunShape, estimate_call
from meshrl.plan.candidates import fit_micro_batches
from meshrl.plan.execution_plan import CallPlan, Cluster, ExecutionPlan
from meshrl.plan.hardware import PRESETS, Hardware
from meshrl.plan.problem import Problem
from meshrl.plan.report import evaluate
from meshrl.plan.strategies import BUILDERS

ROWS = Path(__file__).with_name("published") / "rows.json"


def model_of(spec) -> ModelConfig:
    if isinstance(spec, str):
        return get_preset(spec)
    h = spec["hidden"]
    return ModelConfig(vocab_size=spec["vocab"], hidden_size=h,
                       intermediate_size=spec.get("intermediate", round(8 * h / 3)),
                       num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                       num_key_value_heads=spec.get("kv_heads", spec["heads"]), head_dim=spec.get("head_dim", 0),
                       tie_word_embeddings=spec.get("tied", False))


def predict(row: dict, hw: Hardware) -> float:
    """The row's quantity as meshrl predicts it, in the row's unit."""
    kind = row["kind"]
    if kind in ("decode", "prefill"):
        spec = CallSpec("gen", "actor", "generate", model_of(row["model"]))
        shape = RunShape(row["prompt_len"], row["gen_len"], row["batch"])
        t = estimate_call(spec, shape, Layout(1, row["tp"], 1), 1, hw).time_s
        return row["batch"] * row["gen_len"] / t if kind == "decode" else t * 1e3
    if kind == "train":
        gpus, mb, ga, seq = row["gpus"], row["micro_batch"], row["grad_accum"], row["seq_len"]
        spec = CallSpec("train", "actor", "train", model_of(row["model"]))
        # priced as GPU_FIT was fitted: the dp all-reduce exposed (refit with --fit to price the overlap)
        shape = RunShape(seq, 0, gpus * mb * ga, overlap_grad_reduce=False)
        t = estimate_call(spec, shape, Layout(gpus, row["tp"], 1), ga, hw).time_s
        return gpus * mb * ga * seq / t / gpus
    if kind == "rlhf":
        res = rlhf_plan(row, hw)
        row["_fits"] = res.feasible  # the published system ran it; meshrl's memory model may disagree
        if row["unit"] == "hours per epoch":
            return res.iteration_s * row["queries"] / row["batch"] / 3600
        return res.iteration_s
    raise ValueError(kind)


def rlhf_plan(row: dict, hw: Hardware):
    """The published system's iteration as meshrl prices it: its models, sizes and either its
    strategy (a meshrl builder) or its per-call-kind layouts on all GPUs (``layouts``)."""
    models = {role: model_of(spec) for role, spec in row["models"].items()}
    n = row.get("samples", 1)
    shape = RunShape(row["prompt_len"], row["gen_len"], row["batch"], n, 1, row["mini_batches"],
                     gen_len_mean=row.get("gen_len_mean"), gen_len_longest=row.get("gen_len_longest"),
                     compact=row.get("compact", False))
    dpn = min(8, row["gpus"])
    prob = Problem(graph_for(row["algo"], n), models, shape, hw, Cluster(row["gpus"] // dpn, dpn, row["device"]))
    if "layouts" in row:
        mesh = Mesh.range(0, row["gpus"])
        calls = {c.name: CallPlan(mesh, Layout.parse(row["layouts"][c.kind])) for c in prob.graph.calls}
        # Micro-batches as every meshrl strategy picks them: the fastest count that fits.
        plan = fit_micro_batches(prob, ExecutionPlan(prob.cluster, calls, strategy="published"))
        return evaluate(prob, "published", plan)
    return evaluate(prob, row["strategy"], BUILDERS[row["strategy"]](prob))


def error(row: dict, pred: float) -> float:
    """Predicted time over measured time, minus 1 (throughput rows are inverted)."""
    if row["unit"] in ("out tok/s", "tokens/s/GPU"):
        return row["measured"] / pred - 1
    return pred / row["measured"] - 1


def evaluate_rows(rows: list[dict], hw_of) -> list[tuple[dict, float, float]]:
    return [(r, p, error(r, p)) for r in rows for p in [predict(r, hw_of(r))]]


def summary(results) -> tuple[float, float, int]:
    errs = [abs(e) for _, _, e in results if not math.isnan(e)]
    return statistics.median(errs), max(errs), len(errs)


def print_table(results) -> None:
    print(f"{'row':44s} {'unit':17s} {'measured':>10s} {'predicted':>10s} {'error':>7s}")
    for r, p, e in results:
        pe = "n/a" if math.isnan(p) else f"{p:10.4g}"
        ee = "   OOM" if math.isnan(e) else f"{e:+7.0%}"
        flag = "  (meshrl: does not fit in memory)" if r.get("_fits") is False else ""
        print(f"{r['id']:44s} {r['unit']:17s} {r['measured']:10.4g} {pe:>10s} {ee}{flag}")
    by_src: dict[str, list[float]] = {}
    for r, _, e in results:
        if not math.isnan(e):
            by_src.setdefault(r["source"], []).append(abs(e))
    for src, errs in by_src.items():
        print(f"  {src}: {len(errs)} rows, median |error| {statistics.median(errs):.0%}, worst {max(errs):.0%}")
    med, worst, n = summary(results)
    print(f"all {n} rows: median |error| {med:.0%}, worst {worst:.0%}")


def fit(rows: list[dict]) -> None:
    """Grid search of the fitted constants: one ``mfu_width`` for every GPU and a plateau ``mfu``
    per GPU on the training rows; then (hbm_eff, step_overhead) on the A100 decoding and prefill
    rows. Prints the best of each (the presets in meshrl/plan/hardware.py hold these)."""
    tr = [r for r in rows if r["kind"] == "train"]
    devs = sorted({r["device"] for r in tr})

    def errs(dev: str, m: float, w: float) -> list[float]:
        hw = replace(PRESETS[dev], mfu=m, mfu_width=w)
        return [abs(error(r, predict(r, hw))) for r in tr if r["device"] == dev]

    best = None
    for w in range(0, 1500, 50):
        per = {d: min((statistics.median(errs(d, m / 1000, w)), m / 1000) for m in range(400, 800, 5)) for d in devs}
        allerr = [e for d in devs for e in errs(d, per[d][1], w)]
        cand = (statistics.median(allerr), w, {d: per[d][1] for d in devs})
        best = cand if best is None or cand[0] < best[0] else best
    print(f"training: median |error| {best[0]:.1%} at mfu_width={best[1]}, mfu={best[2]}")
    # the A100 rows only: rows of other GPUs are out-of-sample checks, not fitted
    dr = [r for r in rows if r["kind"] in ("decode", "prefill") and r["device"] == "a100-80g"]
    base = PRESETS["a100-80g"]
    best = min(((statistics.median(abs(error(r, predict(r, replace(base, hbm_eff=e / 100, step_overhead=o / 1e4))))
                                   for r in dr), e / 100, o / 1e4)
                for e in range(50, 101, 5) for o in range(0, 40, 2)))
    print(f"a100 decoding/prefill: median |error| {best[0]:.1%} at hbm_eff={best[1]}, step_overhead={best[2]}")


def _grid_best(rows: list[dict], make_hw, grid) -> tuple:
    """The grid point whose hardware (make_hw(point)) gives ``rows`` the least median |error|."""
    return min(grid, key=lambda g: statistics.median(abs(error(r, predict(r, make_hw(r, g)))) for r in rows))


def holdout(rows: list[dict]) -> None:
    """Leave-one-out: refit the constants without each fitted row, then predict that row. The
    errors printed are out-of-sample; the rows no constant is fitted to (RLHF systems) always are."""
    out = []
    tr = [r for r in rows if r["kind"] == "train"]
    dec = [r for r in rows if r["kind"] in ("decode", "prefill") and r["device"] == "a100-80g"]
    tgrid = [(m / 1000, w) for m in range(450, 800, 10) for w in range(200, 1400, 100)]
    dgrid = [(e / 100, o / 1e4) for e in range(55, 96, 5) for o in range(4, 24, 2)]
    for r in tr:  # plateau per device (rows of the same device), width shared
        rest = [x for x in tr if x is not r and x["device"] == r["device"]]
        m, w = _grid_best(rest, lambda x, g: replace(PRESETS[x["device"]], mfu=g[0], mfu_width=g[1]), tgrid)
        out.append((r, error(r, predict(r, replace(PRESETS[r["device"]], mfu=m, mfu_width=w)))))
    for r in dec:
        rest = [x for x in dec if x is not r]
        e, o = _grid_best(rest, lambda x, g: replace(PRESETS[x["device"]], hbm_eff=g[0], step_overhead=g[1]), dgrid)
        out.append((r, error(r, predict(r, replace(PRESETS[r["device"]], hbm_eff=e, step_overhead=o)))))
    for r, e in out:
        print(f"{r['id']:44s} held-out error {e:+7.0%}")
    errs = [abs(e) for _, e in out]
    print(f"leave-one-out over the {len(errs)} fitted rows: median |error| {statistics.median(errs):.0%}, "
          f"worst {max(errs):.0%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="grid-search the fitted GPU constants")
    ap.add_argument("--holdout", action="store_true", help="leave-one-out errors of the fitted rows")
    ap.add_argument("--rows", default=str(ROWS))
    args = ap.parse_args()
    rows = json.loads(Path(args.rows).read_text())
    if args.fit:
        fit(rows)
        return
    if args.holdout:
        holdout(rows)
        return
    results = evaluate_rows(rows, lambda r: PRESETS[r["device"]])
    print_table(results)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
