"""The runtime's overhead per iteration, per placement strategy, on the demo (4 local gloo ranks).

For each strategy: the median wall time per iteration, and the runtime's overhead as a fraction of
it: the part of the iteration the busiest rank spent outside calls (reallocations, data transfers,
waiting and dispatch), next to the time of the reallocation and transfer steps themselves. The
one-rank run (the same runtime in this process, `meshrl train` without --nprocs) is the reference. Everything is
measured side by side in one run; the first iteration (warm-up) is left out.

    python bench/runtime_overhead.py [--nprocs 4] [--iterations 4] [key=value ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

STRATEGIES = ("colocated", "interleaved", "disaggregated", "heuristic")
DEFAULTS = ["algo=ppo", "data.batch_size=16", "data.gen_len=8", "sft.steps=5"]


def summarize(records: list[dict]) -> dict:
    rec = records[1:] if len(records) > 1 else records
    med = lambda key: statistics.median(r.get(key, 0.0) for r in rec)  # noqa: E731
    keys = {k for r in rec for k in r}
    step = lambda prefix: statistics.median(sum(v for k, v in r.items() if k.startswith(prefix)) for r in rec)  # noqa: E731
    return {"iteration_s": med("time/iteration"), "overhead_frac": med("time/runtime/overhead_frac"),
            "realloc_s": step("time/realloc/"), "transfer_s": step("time/transfer/"),
            "calls": sorted(k[len("time/call/"):] for k in keys if k.startswith("time/call/"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    import torch

    from meshrl.config import load_config
    from meshrl.runtime.job import in_process
    from meshrl.runtime.launch import RankPool
    from meshrl.runtime.plans import resolve_plan
    from meshrl.runtime.run import rank_main

    cfg = load_config(None, DEFAULTS + [f"train.iterations={args.iterations}"] + args.overrides)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    one = in_process(cfg, resolve_plan(cfg, "colocated", 1)[0], None)
    results = {"one rank": summarize(one)}
    with RankPool(args.nprocs, timeout=600) as pool:
        for name in STRATEGIES:
            plan = resolve_plan(cfg, name, args.nprocs)[0]
            records = pool.run(rank_main, cfg, plan, None, quiet=True)[0]
            results[name] = summarize(records) | {"plan": {n: str(cp.placement) for n, cp in plan.calls.items()}}
    out = {"config": DEFAULTS + args.overrides, "nprocs": args.nprocs, "iterations": args.iterations,
           "results": results, "bench_s": time.perf_counter() - t0}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    base = results["one rank"]["iteration_s"]
    print(f"{'strategy':<16}{'s/iteration':>12}{'vs 1 proc':>10}{'overhead':>10}{'realloc_s':>11}{'transfer_s':>12}")
    for name, r in results.items():
        print(f"{name:<16}{r['iteration_s']:>12.3f}{r['iteration_s'] / base:>9.2f}x{r['overhead_frac']:>9.1%}"
              f"{r['realloc_s']:>11.3f}{r['transfer_s']:>12.3f}")


if __name__ == "__main__":
    main()
