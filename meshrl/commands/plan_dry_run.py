"""``meshrl plan ... --dry-run [--json]``: the chosen plan executed on fake tensors and the fake
process group at full size (meshrl/runtime/dry_run.py), printed as predicted against dry-run peak
memory per call and rank, the collective audit, and what failed.

``--json``: ``{"calls": {NAME: {"predicted_mem_gib", "dry_run_mem_gib", "ranks": [{"rank",
"predicted_mem_gib", "dry_run_mem_gib", "simulated_as"}, ...]}}, "collectives": {"checked": N,
"mismatched": [...], "object_collectives": "..."}, "seconds": F, "worst_case": [...],
"simulated": [...], "fits": bool, "failures": [...]}``.
"""

from __future__ import annotations

import json
import statistics

GIB = 2**30
WORST_CASE = ["generation: every row runs to data.gen_len (no EOS, no compaction)",
              "no padding removed (every column and token counts as real)",
              "MoE: every token's top-k picks on the rank's own experts (min(k, held) experts get every token)"]
OBJECTS = ("object collectives (gather_object, all_gather_object, broadcast_object) are checked for order "
           "and root only: the fake group moves no object, so each rank keeps its own")


def report(cfg, problem, plan, every_rank: bool, decode: str, log=None) -> dict:
    """Run the dry run and return the JSON object (see the module docstring); ``log``: progress lines."""
    from ..runtime.dry_run import dry_run  # lazy: --help and `meshrl plan` load no torch

    res = dry_run(cfg, problem, plan, every_rank=every_rank, decode=decode, log=log)
    calls = {}
    for name, per in res.predicted.items():
        ranks = [{"rank": r, "predicted_mem_gib": p / GIB,
                  "dry_run_mem_gib": None if res.measured(name, r) is None else res.measured(name, r) / GIB,
                  "simulated_as": res.stand_in[r]} for r, p in sorted(per.items())]
        measured = [x["dry_run_mem_gib"] for x in ranks if x["dry_run_mem_gib"] is not None]
        calls[name] = {"predicted_mem_gib": max(x["predicted_mem_gib"] for x in ranks),
                       "dry_run_mem_gib": max(measured) if measured else None, "ranks": ranks}
    cap = problem.hw.mem_bytes / GIB
    fits = all(c["dry_run_mem_gib"] is not None and c["dry_run_mem_gib"] <= cap for c in calls.values())
    steps = cfg.ppo.epochs * cfg.ppo.mini_batches
    worst = WORST_CASE + ([f"decoding: the first two and last two steps of {cfg.data.gen_len} (each step has the "
                           "shapes of its neighbours, one token of context apart); pipelined, every micro-batch "
                           "prefilled and the decoding passes of the first two (the others' alike)",
                           f"training: the first {min(2, steps)} of each train call's {steps} optimizer steps (alike "
                           "mini-batches: same rows, shapes and collectives), each on max(pp, 2) of its micro-batches "
                           "(1F1B's most in flight)"] if decode == "ends" else [])
    return {"calls": calls,
            "collectives": {"checked": res.checked, "mismatched": [m.to_dict() for m in res.mismatched],
                            "object_collectives": OBJECTS},
            "seconds": res.seconds, "worst_case": worst, "simulated": res.simulated,
            "classes": res.classes, "device_mem_gib": cap, "fits": fits,
            "failures": res.failures}


def errors(out: dict) -> list[float]:
    """|dry-run - predicted| / dry-run over every call and simulated rank."""
    errs = []
    for c in out["calls"].values():
        for x in c["ranks"]:
            if x["dry_run_mem_gib"] and x["rank"] == x["simulated_as"]:
                errs.append(abs(x["predicted_mem_gib"] - x["dry_run_mem_gib"]) / x["dry_run_mem_gib"])
    return errs


def table(out: dict, plan) -> str:
    """The report as text: one row per call (busiest rank), its simulated ranks, the audit, failures."""
    rows = [("call", "layout", "predicted GiB", "dry run GiB", "error", "simulated ranks (GiB)")]
    for name, c in out["calls"].items():
        sim = [x for x in c["ranks"] if x["rank"] == x["simulated_as"]]
        p, m = c["predicted_mem_gib"], c["dry_run_mem_gib"]
        err = "-" if not m else f"{(p - m) / m:+.0%}"
        detail = ", ".join(f"{x['rank']}: {x['predicted_mem_gib']:.2f}/{x['dry_run_mem_gib']:.2f}" for x in sim[:6]
                           if x["dry_run_mem_gib"] is not None) + (" ..." if len(sim) > 6 else "")
        rows.append((name, str(plan.calls[name].layout), f"{c['predicted_mem_gib']:.2f}",
                     "-" if c["dry_run_mem_gib"] is None else f"{c['dry_run_mem_gib']:.2f}", err, detail))
    w = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(x.ljust(w[i]) if i in (0, 1, 5) else x.rjust(w[i]) for i, x in enumerate(r)) for r in rows]
    lines.insert(1, "  ".join("-" * x for x in w))
    errs = errors(out)
    if errs:
        lines.append(f"memory, predicted against dry run over calls x simulated ranks: median |error| "
                     f"{statistics.median(errs):.0%}, worst {max(errs):.0%}")
    col = out["collectives"]
    lines.append(f"collectives: {col['checked']} checked across group members, {len(col['mismatched'])} mismatched; "
                 f"{col['object_collectives']}")
    lines.append(f"simulated {len(out['simulated'])} of {plan.cluster.size} ranks ({out['classes']} symmetry "
                 f"classes, a second member of each checked) in {out['seconds']:.0f} s")
    lines.append("worst case (data-dependent steps): " + "; ".join(out["worst_case"]))
    lines.append(f"fits in {out['device_mem_gib']:.0f} GiB per device: {'yes' if out['fits'] else 'NO'}")
    for f in out["failures"]:
        lines.append(f"FAILED: {f}")
    if not out["failures"]:
        lines.append("dry run: every simulated rank finished the iteration; no mismatched collective, "
                     "no whole weight or full-vocabulary tensor where the layout shards it")
    return "\n".join(lines)


def run(cfg, problem, plan, as_json: bool, every_rank: bool, decode: str) -> int:
    """Print the dry run of ``plan``; 1 if it failed or does not fit."""
    out = report(cfg, problem, plan, every_rank, decode,
                 log=None if as_json else (lambda line: print(line, flush=True)))
    print(json.dumps(out) if as_json else "\n" + table(out, plan))
    return 0 if out["fits"] and not out["failures"] else 1
