"""Pipelined generation on 2 gloo ranks (pp = 2): the stages taking turns on the whole batch (the
old loop, ``micro_batches=1``) against micro-batches in flight (parallel/generate_micro.py, m = pp
by default), side by side in one run on the same model and prompts, alternated rep by rep; checks
that both give the same tokens (and the one-process engine's), prints the medians and their ratio.

    python bench/pipeline_generate.py [--preset tiny] [--batch 32] [--prompt 16] [--tokens 32]
                                      [--micro 2] [--reps 5] [--sample]

Each rank runs one thread (OMP_NUM_THREADS=1, as meshrl's launcher starts ranks), so on a machine
with 2 free cores the two stages can compute at the same time; on a loaded machine the gain is
what the cores left over allow: the script prints how many cores the two ranks got at once (the
same fixed work on both, before and after), and the CPU time of both ranks, which micro-batches
raise by their extra stage passes (each pays the model's fixed per-call cost).
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


def _setup(preset: str, batch: int, prompt: int, tokens: int, sample: bool) -> bool:
    from meshrl.layout.mesh import Placement
    from meshrl.model.checkpoint import build_model
    from meshrl.model.generation import GenerationConfig
    from meshrl.parallel.groups import GroupCache
    from meshrl.parallel.model import ParallelModel

    model = build_model(preset, seed=0)
    cfg = model.config
    _state["model"] = model
    _state["pm"] = ParallelModel.from_state(cfg, Placement.parse("dp1tp1pp2@0-1"), GroupCache(), model.state_dict())
    gen = torch.Generator().manual_seed(1)
    # prompts of different lengths (left padding), no end-of-sequence: every row decodes `tokens`
    _state["prompts"] = [torch.randint(1, cfg.vocab_size - 8, (prompt - i % 4,), generator=gen).tolist()
                         for i in range(batch)]
    _state["seeds"] = list(range(batch)) if sample else None
    _state["cfg"] = GenerationConfig(max_new_tokens=tokens, greedy=not sample, top_k=50, top_p=0.95,
                                     eos_token_id=None, pad_token_id=cfg.pad_token_id or 0, compile=False)
    return True


def _run(m: int) -> tuple[float, float, torch.Tensor]:
    from meshrl.parallel.generate import pipelined_generate

    pm = _state["pm"]
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    out = pipelined_generate(pm.stage, pm.pipe, pm.groups.tp, _state["prompts"], _state["cfg"], _state["seeds"],
                             micro_batches=m)
    return time.perf_counter() - t0, time.process_time() - c0, out.responses


def _spin() -> tuple[float, float]:
    """The same fixed work on both ranks at once: (wall, CPU seconds) of this rank."""
    a = torch.randn(256, 256)
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(400):
        a = torch.tanh(a @ a)
    return time.perf_counter() - t0, time.process_time() - c0


def _cores(pool: RankPool) -> float:
    """Cores the two ranks got at once: their CPU seconds over the wall time of the slower."""
    res = pool.run(_spin)
    return sum(c for _, c in res) / max(w for w, _ in res)


def _one_process() -> torch.Tensor:
    from meshrl.model.generation import generate

    return generate(_state["model"], _state["prompts"], _state["cfg"], _state["seeds"]).responses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--micro", type=int, default=2, help="micro-batches in flight (>= pp = 2)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sample", action="store_true", help="sample (top-k 50, top-p 0.95) instead of greedy")
    args = ap.parse_args()
    times: dict[int, list[float]] = {1: [], args.micro: []}
    cpu: dict[int, list[float]] = {1: [], args.micro: []}
    with RankPool(2, timeout=600) as pool:
        pool.run(_setup, args.preset, args.batch, args.prompt, args.tokens, args.sample)
        want = pool.run(_one_process)[0]
        cores = [_cores(pool)]
        for r in range(args.reps + 1):
            for m in times:
                res = pool.run(_run, m)
                toks = [tok for _, _, tok in res]
                if not all(torch.equal(t, want) for t in toks):
                    raise SystemExit(f"tokens differ from the one-process engine with micro_batches={m}")
                if r:  # the first round warms up
                    times[m].append(max(t for t, _, _ in res))  # the slower rank ends the call
                    cpu[m].append(sum(c for _, c, _ in res))
        cores.append(_cores(pool))
    old, new = statistics.median(times[1]), statistics.median(times[args.micro])
    mode = "sampled" if args.sample else "greedy"
    print(f"{args.preset}, pp2 on 2 gloo ranks, {args.batch} prompts of <= {args.prompt} tokens, "
          f"{args.tokens} new tokens ({mode}), medians of {args.reps} alternated reps; tokens equal "
          f"to one process in every rep")
    c_old, c_new = statistics.median(cpu[1]), statistics.median(cpu[args.micro])
    print("                                          wall       CPU of both ranks")
    print(f"stages take turns (micro_batches=1)      {old * 1e3:8.1f} ms  {c_old * 1e3:8.1f} ms")
    print(f"micro-batches in flight (micro_batches={args.micro}) {new * 1e3:8.1f} ms  {c_new * 1e3:8.1f} ms")
    print(f"wall time: x{old / new:.2f} faster with micro-batches in flight (CPU time x{c_new / c_old:.2f})")
    print(f"cores the two ranks got at once (a fixed spin on both, before and after): "
          f"{cores[0]:.2f} and {cores[1]:.2f} of 2")


if __name__ == "__main__":
    main()
