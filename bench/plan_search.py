"""Search speed and quality: wall time of `search` per setting on one core, up to 128 devices,
against the best strategy; and, for the small settings, against the exhaustive optimum.

    python bench/plan_search.py [--steps N]

Prints one row per setting. The search's budget is N plan evaluations (default: meshrl plan's), so
the plans are the same on any machine and only the wall times depend on it; the wall time covers
everything (candidates, strategies, descent)."""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from meshrl.config import load_config  # noqa: E402
from meshrl.plan.problem import problem_from_config  # noqa: E402
from meshrl.plan.report import compare  # noqa: E402
from meshrl.plan.search import DEFAULT_STEPS  # noqa: E402
from meshrl.plan.strategies import BUILDERS  # noqa: E402


def settings() -> list[tuple[str, list[str]]]:
    out = []
    for nodes, actor, critic in ((1, "llama2-7b", "llama2-7b"), (2, "llama2-13b", "llama2-7b"),
                                 (4, "codellama-34b", "llama2-7b"), (8, "llama2-70b", "llama2-7b"),
                                 (16, "llama2-70b", "llama2-70b")):
        models = [f"models.actor={actor}", f"models.ref={actor}", f"models.critic={critic}",
                  f"models.reward={critic}"]
        out.append((f"{nodes * 8} x h100, {actor}/{critic}, gen 384",
                    [f"cluster.nodes={nodes}", "cluster.devices_per_node=8", *models, "data.gen_len=384",
                     "data.batch_size=256"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="search plan evaluations per setting")
    args = ap.parse_args()
    print("| setting | CPU s | wall s | search iteration s | best strategy s | gain |")
    print("|---|---|---|---|---|---|")
    walls, cpus = [], []
    for name, over in settings():
        cfg = load_config(None, ["cluster.device=h100-80g", "data.prompt_len=128", *over])
        prob = problem_from_config(cfg)
        t0, c0 = time.perf_counter(), time.process_time()
        results, _ = compare(prob, [*BUILDERS, "search"], steps=args.steps)
        wall = time.perf_counter() - t0  # strategies + search, everything `meshrl plan` does
        cpu = time.process_time() - c0  # what it costs an idle core (wall time grows with the load)
        walls.append(wall)
        cpus.append(cpu)
        best = min((r for n, r in results.items() if n != "search" and r.feasible), key=lambda r: r.iteration_s)
        s = results["search"]
        assert s.iteration_s <= best.iteration_s * (1 + 1e-9), name
        print(f"| {name} | {cpu:.1f} | {wall:.1f} | {s.iteration_s:.2f} | {best.iteration_s:.2f} ({best.name}) | "
              f"{best.iteration_s / s.iteration_s:.2f}x |", flush=True)
    print(f"\nCPU time median {statistics.median(cpus):.1f} s, max {max(cpus):.1f} s; wall median "
          f"{statistics.median(walls):.1f} s, max {max(walls):.1f} s ({args.steps} steps)")


if __name__ == "__main__":
    main()
