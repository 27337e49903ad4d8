"""One training step through the parallel code at dp = tp = pp = 1 against the plain model, measured
side by side in one run (target: ratio <= 1.05).

    python bench/parallel_step.py [--model small] [--batch 4] [--seq 128] [--repeats 5] [--json]

Both sides start from the same weights and take the same step: per-token log-probs, a
token-normalised cross-entropy, backward, gradient clipping to norm 1, AdamW (torch's, foreach=False
on both sides). The steps alternate (plain, parallel, plain, ...) so that noise from other work on
the machine hits both alike; the medians and their ratio are printed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from meshrl.model.checkpoint import build_model
from meshrl.model.generation import sequence_logprobs
from meshrl.parallel.data import AdamWConfig
from meshrl.parallel.groups import GroupCache
from meshrl.layout.mesh import Placement
from meshrl.model.heads import HeadOutputs
from meshrl.parallel.model import ParallelModel

OPT = AdamWConfig(lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)


def token_loss(out: HeadOutputs, mb: dict, n_tokens: float) -> torch.Tensor:
    return -(out.logprobs * mb["loss_mask"]).sum() / n_tokens


def make_batch(vocab: int, batch: int, seq: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": mask[:, 1:].float()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rdv')}", rank=0, world_size=1)
        plain = build_model(args.model, seed=0)
        cfg = plain.config
        pm = ParallelModel.from_state(cfg, Placement.parse("dp1tp1pp1@0"), GroupCache(), plain.state_dict(),
                                      optim=OPT)
        opt = torch.optim.AdamW(plain.parameters(), lr=OPT.lr, betas=OPT.betas, eps=OPT.eps,
                                weight_decay=OPT.weight_decay, foreach=False)
        batch = make_batch(cfg.vocab_size, args.batch, args.seq)
        loss_fn = functools.partial(token_loss, n_tokens=float(batch["loss_mask"].sum()))

        def plain_step() -> float:
            lp = sequence_logprobs(plain, batch["input_ids"], batch["attention_mask"])
            loss = loss_fn(HeadOutputs(logprobs=lp), batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(plain.parameters(), OPT.max_grad_norm, foreach=False)
            opt.step()
            opt.zero_grad()
            return loss.item()

        def parallel_step() -> float:
            return pm.train_step(batch, loss_fn)["loss"]

        times: dict[str, list[float]] = {"plain": [], "parallel": []}
        losses: dict[str, list[float]] = {"plain": [], "parallel": []}
        for rep in range(args.repeats + 1):  # the first round warms up and is not counted
            for name, fn in (("plain", plain_step), ("parallel", parallel_step)):
                t0 = time.perf_counter()
                loss = fn()
                if rep:
                    times[name].append(time.perf_counter() - t0)
                losses[name].append(loss)
        dist.destroy_process_group()

    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"model": args.model, "batch": args.batch, "seq": args.seq, "repeats": args.repeats,
           "plain_s": med["plain"], "parallel_s": med["parallel"], "ratio": med["parallel"] / med["plain"],
           "max_loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(losses["parallel"], losses["plain"],
                                                                         strict=True))}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.model}: one training step (batch {args.batch} x {args.seq} tokens), median of {args.repeats}")
        print(f"  plain model      {out['plain_s']:.3f} s")
        print(f"  parallel dp1tp1pp1 {out['parallel_s']:.3f} s")
        print(f"  ratio            {out['ratio']:.3f}  (target <= 1.05)")
        print(f"  losses agree to  {out['max_loss_rel_diff']:.1e} (relative), step after step")


if __name__ == "__main__":
    main()
