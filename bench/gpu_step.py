"""One device, three figures, measured side by side in one run (bench/gpu.sh runs it on a GPU):

1. a training step as the runtime takes it (ParallelModel on one rank: the rank's shards loaded by
   InitLoader straight onto the device, train.dtype, ZeRO-1 AdamW with fp32 master weights): tokens/s
   and MFU = model FLOPs (plan/model_costs.py: 3 x (matmul + causal attention)) / s / peak FLOP/s
   (the device preset's datasheet figure, plan/hardware.py);
2. the step's peak memory (CUDA max_memory_allocated; CPU live tensor bytes, runtime/memory.py)
   against the planner's prediction for the same call (plan/estimator.py, dp = tp = pp = 1);
3. greedy generation tokens/s, meshrl (model/generation.py) against transformers.generate on the
   same weights, same prompts, same device and dtype; runs alternate, medians printed.

    python bench/gpu_step.py --preset qwen2.5-1.5b --device cuda --dtype bfloat16
    python bench/gpu_step.py --preset tiny --device cpu --dtype bfloat16 --steps 2   (the --dry-run)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train_step(args, dev: torch.device, dtype: torch.dtype) -> dict:
    from meshrl.layout.mesh import Layout, Placement
    from meshrl.model.presets import get_preset
    from meshrl.parallel.data import AdamWConfig
    from meshrl.parallel.groups import GroupCache
    from meshrl.parallel.load import InitLoader
    from meshrl.parallel.model import ParallelModel
    from meshrl.plan.estimator import CallSpec, RunShape, estimate_call
    from meshrl.plan.hardware import PRESETS
    from meshrl.plan.model_costs import model_costs
    from meshrl.runtime.memory import call_peak

    cfg = get_preset(args.preset)
    pm = ParallelModel.create(cfg, Placement.parse("dp1tp1pp1@0"), GroupCache(), InitLoader(cfg, 0, dtype=dtype),
                              optim=AdamWConfig(lr=1e-5), activation_checkpointing=args.activation_checkpointing)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (args.batch, args.seq), generator=g).to(dev)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    tokens = args.batch * (args.seq - 1)

    def loss_fn(out, mb):
        return -(out.logprobs.float().sum()) / tokens

    def step() -> None:
        pm.forward_backward(batch, loss_fn, micro_batches=args.micro)
        pm.optimizer_step()

    step()  # warm-up: kernels chosen, allocator primed
    box: dict = {}
    roles = {"actor": type("R", (), {"models": {0: pm}, "offloaded": {}})()}
    with call_peak(roles, dev, box):
        step()
    times = []
    for _ in range(args.steps):
        _sync(dev)
        t0 = time.perf_counter()
        step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    mc = model_costs(cfg)
    flops = 3 * args.batch * (args.seq * mc.matmul_flops_per_token() + mc.attn_flops(args.seq, args.seq))
    peak = PRESETS[args.peak_of].peak_flops if args.peak_of in PRESETS else float("nan")
    hw = PRESETS.get(args.peak_of) or PRESETS["h200"]
    hw = type(hw)(**{**hw.__dict__, "dtype_bytes": torch.empty((), dtype=dtype).element_size()})
    shape = RunShape(prompt_len=args.seq // 2, gen_len=args.seq - args.seq // 2, batch_size=args.batch)
    est = estimate_call(CallSpec("actor_train", "actor", "train", cfg), shape, Layout(1, 1, 1), args.micro, hw)
    return {"preset": args.preset, "params": sum(p.numel() for p in pm.named.values()), "dtype": str(dtype),
            "step_s": sec, "tokens_per_s": args.batch * args.seq / sec, "tflops": flops / sec / 1e12,
            "mfu": flops / sec / peak, "peak_of": args.peak_of,
            "measured_mem_gib": box["peak"] / 2**30, "predicted_mem_gib": est.mem_bytes / 2**30,
            "mem_error": (est.mem_bytes - box["peak"]) / box["peak"]}


def generation(args, dev: torch.device, dtype: torch.dtype) -> dict:
    from transformers import AutoModelForCausalLM

    from meshrl.model.checkpoint import build_model
    from meshrl.model.generation import GenerationConfig, generate

    ours = build_model(args.preset, seed=0, dtype=dtype, device=dev).eval()
    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        theirs = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(dev).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, ours.config.vocab_size, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.gen_batch)]
    gcfg = GenerationConfig(max_new_tokens=args.new_tokens, greedy=True, eos_token_id=None,
                            compile=args.gen_compile)
    ids = torch.tensor(prompts, device=dev)
    t_ours, t_theirs = [], []
    for _ in range(args.repeats + 1):  # the first pair is a warm-up
        _sync(dev)
        t0 = time.perf_counter()
        generate(ours, prompts, gcfg)
        _sync(dev)
        t1 = time.perf_counter()
        with torch.no_grad():
            theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                            min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        _sync(dev)
        t_ours.append(t1 - t0)
        t_theirs.append(time.perf_counter() - t1)
    n = args.gen_batch * args.new_tokens
    a, b = statistics.median(t_ours[1:]), statistics.median(t_theirs[1:])
    return {"meshrl_tokens_per_s": n / a, "transformers_tokens_per_s": n / b, "ratio": b / a,
            "gen_compile": args.gen_compile}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--peak-of", default="h200", help="device preset whose datasheet peak FLOP/s the MFU uses")
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-generation", action="store_true")
    ap.add_argument("--gen-compile", action="store_true",
                    help="meshrl's decode step through torch.compile (CUDA graphs on a GPU); the warm-up compiles")
    args = ap.parse_args()
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1)
    from meshrl.parallel import comm

    comm.setup()
    try:
        out = {"train": train_step(args, dev, dtype)}
        if not args.skip_generation:
            out["generate"] = generation(args, dev, dtype)
    finally:
        dist.destroy_process_group()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
