"""One training step of the tiny model on 2 gloo ranks under dp2 and pp2, against one rank alone,
split into forward + backward (with the gradient all-reduce) and the optimizer step (clip + ZeRO-1
AdamW + its all-gather), measured side by side in one run (layouts alternated, two rounds).

    python bench/dp_step.py [--batch 32] [--seq 32] [--reps 5]

Why: the runtime's ZeRO-1 all-gathered its updated shards once per parameter tensor (75 gloo
collectives for the tiny model: a dp2 optimizer step of 72-90 ms against 14 ms on one rank); it now
gathers 25 MB buckets (meshrl/parallel/data.py). The whole batch is split over dp, so dp2 computes
half of it per rank; pp2 runs 1 and 4 micro-batches through the 1F1B schedule.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from meshrl.runtime.launch import RankPool  # noqa: E402

_state: dict = {}


def _setup(batch: int, seq: int) -> bool:
    from meshrl.model.checkpoint import build_model
    from meshrl.parallel.data import AdamWConfig
    from meshrl.parallel.groups import GroupCache
    from meshrl.layout.mesh import Placement
    from meshrl.parallel.model import ParallelModel

    opt = AdamWConfig(lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
    plain = build_model("tiny", seed=0)
    cache = GroupCache()
    for name, text in (("dp2", "dp2tp1pp1@0-1"), ("pp2", "dp1tp1pp2@0-1")):
        _state[name] = ParallelModel.from_state(plain.config, Placement.parse(text), cache, plain.state_dict(),
                                                optim=opt)
    state = plain.state_dict() if dist.get_rank() == 0 else None
    _state["one"] = ParallelModel.from_state(plain.config, Placement.parse("dp1tp1pp1@0"), cache, state, optim=opt)
    gen = torch.Generator().manual_seed(1)

    def make(n: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, plain.config.vocab_size - 8, (n, seq), generator=gen)
        mask = torch.ones(n, seq, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "loss_mask": mask[:, 1:].float()}

    _state["half"], _state["full"] = make(batch // 2), make(batch)
    n_tokens = float(batch * (seq - 1))
    _state["loss"] = lambda out, mb: -(out.logprobs * mb["loss_mask"]).sum() / n_tokens
    return True


def _step(which: str, micro: int, reps: int) -> tuple[float, float] | None:
    """Median seconds of (forward + backward, optimizer step) over ``reps`` steps after a warm-up."""
    model = _state[which]
    if model is None:
        return None
    batch = _state["half"] if which == "dp2" else _state["full"]
    fb, opt = [], []
    for r in range(reps + 1):
        if which != "one":
            dist.barrier()
        t0 = time.perf_counter()
        model.forward_backward(batch, _state["loss"], micro)
        t1 = time.perf_counter()
        model.optimizer_step()
        t2 = time.perf_counter()
        if r:
            fb.append(t1 - t0)
            opt.append(t2 - t1)
    return statistics.median(fb), statistics.median(opt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32, help="sequences per step (split over dp)")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    cases = (("one", 1), ("dp2", 1), ("pp2", 1), ("pp2", 4))
    got: dict[tuple[str, int], list[tuple[float, float]]] = {c: [] for c in cases}
    with RankPool(2, backend="gloo", timeout=300) as pool:
        pool.run(_setup, args.batch, args.seq)
        for _ in range(2):
            for which, micro in cases:
                got[(which, micro)].append(pool.run(_step, which, micro, args.reps)[0])
    print(f"tiny model, {args.batch} x {args.seq} tokens per step, medians of {args.reps} steps, 2 rounds")
    print(f"{'layout':<14}{'fwd+bwd ms':>12}{'optimizer ms':>14}{'step ms':>10}{'vs 1 rank':>11}")
    alone = statistics.median(f + o for f, o in got[("one", 1)])
    for (which, micro), runs in got.items():
        fb = statistics.median(f for f, _ in runs)
        op = statistics.median(o for _, o in runs)
        name = {"one": "1 rank", "dp2": "dp2", "pp2": f"pp2, m{micro}"}[which]
        print(f"{name:<14}{fb * 1e3:>12.1f}{op * 1e3:>14.1f}{(fb + op) * 1e3:>10.1f}{alone / (fb + op):>10.2f}x")


if __name__ == "__main__":
    main()
