"""Estimator accuracy on this machine, one rank: predicted (CPU profile) against measured time of
each call kind with meshrl's own model, side by side in one run.

    python bench/estimator_accuracy.py [--profile FILE] [--reps 3]

Run `meshrl profile` first (on an idle machine). Measured: `meshrl.model.generate` (prefill +
decoding with the KV cache), `sequence_logprobs` without gradients (inference), and one PPO-style
optimizer step (log-probs, backward, AdamW). Prints each call's predicted and measured median
seconds and the relative error, then the median and worst error."""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from meshrl.model import GenerationConfig, build_model, generate, get_preset, sequence_logprobs  # noqa: E402
from meshrl.parallel.mesh import Layout  # noqa: E402
from meshrl.plan.estimator import CallSpec, RunShape, estimate_call  # noqa: E402
from meshrl.plan.hardware import load_profile  # noqa: E402

CASES = (("tiny", RunShape(16, 16, 32)), ("tiny", RunShape(32, 64, 64)), ("small", RunShape(32, 16, 8)))


def _median(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


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

    return {"generate": _median(lambda: generate(model, prompts, gen_cfg), reps),
            "inference": _median(infer, reps), "train": _median(train, reps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
