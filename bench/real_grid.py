"""ReaL's throughput grid, predicted: every strategy and the search on H100 clusters.

LLaMA-2 7B, 13B, CodeLLaMA-34B and LLaMA-2 70B on 8, 16, 32 and 64 H100s (model size and cluster
grow together, as in ReaL): "scale actor" (actor and reference at that size, critic and reward
7B), "scale critic" (the reverse), "scale both" (all four at that size, on twice the GPUs);
prompts of 128 tokens, generation of 128, 384 and 896, 2^17 tokens per iteration (so
batch_size = 2^17 / (128 + gen) prompts). PPO, synchronous, one epoch of 4 mini-batches
(4 optimizer steps per iteration); each cell's search has a small budget.

    python bench/real_grid.py [--steps 2000] [--out docs/real_grid.md]

Asserts in every cell that the search is no worse than the best strategy."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from meshrl.config import load_config  # noqa: E402
from meshrl.plan.problem import problem_from_config  # noqa: E402
from meshrl.plan.report import compare  # noqa: E402
from meshrl.plan.strategies import BUILDERS  # noqa: E402

SIZES = (("llama2-7b", "7B", 8), ("llama2-13b", "13B", 16), ("codellama-34b", "34B", 32), ("llama2-70b", "70B", 64))
GENS = (128, 384, 896)
SMALL = "llama2-7b"
COLUMNS = (*BUILDERS, "search")


def cells():
    for scale in ("actor", "critic", "both"):
        for preset, label, gpus in SIZES:
            big, small = preset, SMALL
            actor = big if scale in ("actor", "both") else small
            critic = big if scale in ("critic", "both") else small
            n = gpus * 2 if scale == "both" else gpus
            for gen in GENS:
                yield scale, label, n, gen, actor, critic


def run_cell(actor: str, critic: str, n: int, gen: int, steps: int):
    over = ["cluster.device=h100-80g", f"cluster.nodes={n // 8}", "cluster.devices_per_node=8",
            f"models.actor={actor}", f"models.ref={actor}", f"models.critic={critic}", f"models.reward={critic}",
            "data.prompt_len=128", f"data.gen_len={gen}", f"data.batch_size={2**17 // (128 + gen)}",
            "ppo.mini_batches=4"]
    prob = problem_from_config(load_config(None, over))
    results, _ = compare(prob, list(COLUMNS), steps=steps)
    return results


def fmt(r) -> str:
    return f"{r.iteration_s:.1f} / {r.pflops:.2f}" if r.feasible else "OOM"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=2000, help="search plan evaluations per cell")
    ap.add_argument("--out", default="docs/real_grid.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    head = ("| setting | model | GPUs | gen | " + " | ".join(COLUMNS)
            + " | search vs best strategy | search vs heuristic |")
    lines = [head, "|" + "---|" * (len(COLUMNS) + 6)]
    print(head, flush=True)
    rows = []
    for scale, label, n, gen, actor, critic in cells():
        res = run_cell(actor, critic, n, gen, args.steps)
        feas = [r for k, r in res.items() if k != "search" and r.feasible]
        s = res["search"]
        rows.append((f"scale {scale} {label} on {n}, gen {gen}", res))
        if feas:
            best = min(feas, key=lambda r: r.iteration_s)
            assert s.feasible and s.iteration_s <= best.iteration_s * (1 + 1e-9), (scale, label, gen)
            gain = f"{best.iteration_s / s.iteration_s:.2f}x ({best.name})"
        else:
            gain = "only search fits"
        heu = res["heuristic"]
        vs_heu = f"{heu.iteration_s / s.iteration_s:.2f}x" if heu.feasible else "heuristic OOM"
        line = (f"| scale {scale} | {label} | {n} | {gen} | " + " | ".join(fmt(res[c]) for c in COLUMNS)
                + f" | {gain} | {vs_heu} |")
        lines.append(line)
        print(line, flush=True)
    total = time.perf_counter() - t0
    note = (f"\nEach cell: predicted seconds per iteration / PFLOP/s (H100 preset, PPO, 2^17 tokens per iteration, "
            f"search budget {args.steps} plan evaluations). OOM: the strategy's plan does not fit in 80 GB.\n"
            f"Produced by `python bench/real_grid.py --steps {args.steps}` in {total:.0f} s.\n")
    note += "\n" + summary(rows) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("# ReaL's grid, predicted by meshrl's planner\n\n" + "\n".join(lines) + "\n" + note)
    print(note)


def summary(rows: list[tuple[str, dict]]) -> str:
    """What the grid says, counted from its cells (docs/planner.md quotes it): the best fixed strategy
    per cell, and the search's gain over it and over the heuristic (smallest, median, largest)."""
    wins: dict[str, int] = {}
    over_best, over_heu = [], []
    for where, res in rows:
        feas = {k: r for k, r in res.items() if k != "search" and r.feasible}
        if not feas:
            continue
        best = min(feas.values(), key=lambda r: r.iteration_s)
        wins[best.name] = wins.get(best.name, 0) + 1
        over_best.append((best.iteration_s / res["search"].iteration_s, where))
        if res["heuristic"].feasible:
            over_heu.append((res["heuristic"].iteration_s / res["search"].iteration_s, where))
    def span(xs):  # noqa: E306
        xs = sorted(xs)
        return (f"{xs[0][0]:.2f}x ({xs[0][1]}) to {xs[-1][0]:.2f}x ({xs[-1][1]}), median {xs[len(xs) // 2][0]:.2f}x")
    won = ", ".join(f"{k} in {v}" for k, v in sorted(wins.items(), key=lambda kv: -kv[1]))
    return (f"Summary of the {len(rows)} cells: the best fixed strategy is {won}. The search is "
            f"{span(over_best)} faster than the best fixed strategy, and {span(over_heu)} faster than the "
            f"Megatron-style heuristic.")


if __name__ == "__main__":
    main()
