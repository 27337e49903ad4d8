"""Estimator accuracy on this machine: predicted (CPU profile) against measured time, side by side.

    python bench/estimator_accuracy.py [--profile FILE] [--ranks 2,4] [--strategies colocated,interleaved]
                                       [--iterations 5]
    python bench/estimator_accuracy.py --one-rank [--profile FILE] [--reps 3]

Run `meshrl profile` first (on an idle machine).

Default (ranks): the PPO demo (`meshrl train`'s sizes) under each strategy on each number of local
gloo ranks, run by the runtime exactly as `meshrl plan --validate` does (meshrl/runtime/validate.py:
no SFT warm-up, nothing written between iterations); per call and per iteration the predicted
seconds (the simulator's, steps stretched where ranks share cores) and the median measured over the
iterations after the first; then one line per run and a last summary line with the median and worst
relative error over every call (the rule reward left out: it runs no model) and iteration, each
also without the shared-cores model (the same measurements predicted as if every rank had a core),
with the load average. The four default runs take 2.5-4.5 min on a 2-core machine at load 11-18.

--one-rank: meshrl's model in this process: `meshrl.model.generate` (prefill + decoding with the KV
cache), `sequence_logprobs` without gradients (inference), and one PPO-style optimizer step
(log-probs, backward, AdamW), at the demo's sizes and two others."""

from __future__ import annotations

import argparse
import os
import dataclasses
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from meshrl.model import GenerationConfig, build_model, generate, get_preset, sequence_logprobs  # noqa: E402
from meshrl.layout.mesh import Layout  # noqa: E402
from meshrl.plan.estimator import CallSpec, RunShape, estimate_call  # noqa: E402
from meshrl.plan.hardware_profile import load_profile  # noqa: E402
from meshrl.profile.layers import median_time  # noqa: E402

CASES = (("tiny", RunShape(16, 16, 32)), ("tiny", RunShape(32, 64, 64)), ("small", RunShape(32, 16, 8)))


def measure(preset: str, shape: RunShape, reps: int) -> dict[str, float]:
    cfg = get_preset(preset)
    model = build_model(cfg)
    prompts = [[(7 * i + j) % 200 + 1 for j in range(shape.prompt_len)] for i in range(shape.batch_size)]
    gen_cfg = GenerationConfig(max_new_tokens=shape.gen_len, greedy=True, eos_token_id=None)
    ids = torch.randint(1, 200, (shape.batch_size, shape.seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def infer() -> None:
        with torch.no_grad():
            sequence_logprobs(model, ids)

    def train() -> None:
        loss = -sequence_logprobs(model, ids).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"generate": median_time(lambda: generate(model, prompts, gen_cfg), reps),
            "inference": median_time(infer, reps), "train": median_time(train, reps)}


def one_rank(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # as each rank of a CPU run, and as the profile measured
    hw = load_profile(args.profile, 1)
    errors = []
    print("| model | prompt+gen x batch | call | predicted s | measured s | error |")
    print("|---|---|---|---|---|---|")
    for preset, shape in CASES:
        got = measure(preset, shape, args.reps)
        for kind, t in got.items():
            pred = estimate_call(CallSpec(kind, "actor", kind, get_preset(preset)), shape, Layout(), 1, hw).time_s
            err = (pred - t) / t
            errors.append(abs(err))
            print(f"| {preset} | {shape.prompt_len}+{shape.gen_len} x {shape.batch_size} | {kind} | {pred:.4f} | "
                  f"{t:.4f} | {err:+.0%} |", flush=True)
    print(f"\nmedian |error| {statistics.median(errors):.0%}, worst {max(errors):.0%} ({len(errors)} calls)")


def _errors(rows) -> list[float]:
    return [abs(r.error) for r in rows if r.kind in ("call", "iteration") and r.modelled]


def on_ranks(args: argparse.Namespace) -> None:
    """The demo under each strategy on each rank count; one table each, then the errors per run and
    overall, with and without the shared-cores model (the same measurements, predicted both ways)."""
    from meshrl.commands.train import DEMO_DEFAULTS
    from meshrl.config import load_config
    from meshrl.plan.problem import problem_from_config
    from meshrl.plan.strategies import build
    from meshrl.plan.validate import compare, table
    from meshrl.runtime.validate import rule_calls, run_plan

    t_all = time.perf_counter()
    hw = load_profile(args.profile, 1)
    print(f"profile: {hw.cores} usable cores, slowdown with k busy ranks "
          + ", ".join(f"{k}: {f:.2f}" for k, f in hw.contention) + f"; load average {_load()}", flush=True)
    errors: list[float] = []
    plain: list[float] = []
    runs: list[str] = []
    for n in (int(x) for x in args.ranks.split(",")):
        for strategy in args.strategies.split(","):
            cfg = load_config(None, DEMO_DEFAULTS["ppo"] + ["cluster.device=cpu", f"cluster.devices_per_node={n}"])
            problem = problem_from_config(cfg, args.profile)
            plan = build(problem, strategy)
            t = time.perf_counter()
            records = run_plan(cfg, plan, args.iterations, n)
            rows = compare(problem, plan, records, rule_calls(cfg, plan))
            problem.hw = dataclasses.replace(problem.hw, contention=())  # every rank its own core
            rows0 = compare(problem, plan, records, rule_calls(cfg, plan))
            layouts = ", ".join(f"{c} {cp.layout}@{cp.mesh} m{cp.micro_batches}" for c, cp in plan.calls.items())
            e, e0 = _errors(rows), _errors(rows0)
            runs.append(f"{n} ranks {strategy}: median {statistics.median(e):.0%}, worst {max(e):.0%} "
                        f"(without the shared-cores model {statistics.median(e0):.0%}, {max(e0):.0%})")
            print(f"\n### {n} ranks, {strategy} ({time.perf_counter() - t:.0f} s wall, load average {_load()})"
                  f"\n{layouts}\n{table(rows)}\n{runs[-1]}", flush=True)
            errors += e
            plain += e0
    print("\n" + "\n".join(runs))
    print(f"\nall runs: median |error| {statistics.median(errors):.0%}, worst {max(errors):.0%} "
          f"({len(errors)} calls and iterations; without the shared-cores model {statistics.median(plain):.0%}, "
          f"{max(plain):.0%}); {time.perf_counter() - t_all:.0f} s, load average {_load()}")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--one-rank", action="store_true", help="the model in this process, per call kind")
    ap.add_argument("--reps", type=int, default=3, help="--one-rank: timed repetitions per call")
    ap.add_argument("--ranks", default="2,4", help="comma-separated local rank counts")
    ap.add_argument("--strategies", default="colocated,interleaved")
    ap.add_argument("--iterations", type=int, default=5, help="per run; the first is a warm-up")
    args = ap.parse_args()
    if args.one_rank:
        one_rank(args)
    else:
        on_ranks(args)


if __name__ == "__main__":
    main()
