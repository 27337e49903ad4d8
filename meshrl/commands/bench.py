"""``meshrl bench``: benchmarks that measure ours against the hardware limit, side by side in one run.

    meshrl bench realloc --model PRESET|DIR --from LAYOUT@RANKS --to LAYOUT@RANKS [--json]
    meshrl bench generate --model DIR --prompts FILE.jsonl --batch-size B --max-new-tokens N
                          [--backend meshrl|vllm] [--compile] [--greedy] [--json]   (bench_generate.py)

Each benchmark is one entry of BENCHES: (help, add_arguments, run); add a new one there.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Callable

from ..errors import UserError
from ..model.presets import PRESETS, get_preset
from ..layout.mesh import Placement
from ..layout.realloc_plan import realloc_plan
from ..layout.shardmap import shard_map
from ..runtime.launch import RankPool


# ---- bench realloc ----------------------------------------------------------------------------------
def _realloc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model preset (e.g. small) or a checkpoint directory")
    p.add_argument("--from", dest="src", required=True, metavar="LAYOUT@RANKS", help="e.g. dp2tp2pp1@0-3")
    p.add_argument("--to", dest="dst", required=True, metavar="LAYOUT@RANKS", help="e.g. dp4tp1pp1@4-7")
    p.add_argument("--value-head", action="store_true", help="a value model (score head instead of lm_head)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
                   help="parameter dtype moved (default bf16)")
    p.add_argument("--bucket-mb", type=float, default=32.0, help="bucket size per link and round (MiB)")
    p.add_argument("--repeat", type=int, default=5, help="interleaved timed runs; medians are reported")
    p.add_argument("--p2p-mb", type=float, default=256.0, help="message size of the p2p measurement (MiB)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's random weights (default 0)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds any rank may take per step")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _model_config(arg: str):
    from ..model.checkpoint import read_config  # lazy: --help and `meshrl plan` load no torch

    if arg in PRESETS or not Path(arg).exists():
        return get_preset(arg)
    return read_config(arg)[0]


def _realloc_run(args: argparse.Namespace) -> int:
    cfg = _model_config(args.model)
    src, dst = Placement.parse(args.src), Placement.parse(args.dst)
    for flag, value in (("--repeat", args.repeat), ("--bucket-mb", args.bucket_mb), ("--p2p-mb", args.p2p_mb),
                        ("--timeout", args.timeout)):
        if not value > 0:
            raise UserError(f"{flag} must be positive, got {value}")
    itemsize = {"bf16": 2, "fp16": 2, "fp32": 4}[args.dtype]
    # Validate and plan here, before any rank starts: a bad layout is one message, not 8 tracebacks.
    plan = realloc_plan(shard_map(cfg, src, args.value_head), shard_map(cfg, dst, args.value_head), itemsize)
    links = plan.link_bytes()
    a, b = max(links, key=links.get) if links else (0, 1)  # p2p over the busiest link's path
    world = max(max(src.mesh.ranks), max(dst.mesh.ranks), a, b) + 1
    p2p_bytes = int(args.p2p_mb * 2**20)
    res = _realloc_ranks(cfg, args, world, int(args.bucket_mb * 2**20), (p2p_bytes, a, b))
    # every rank times the same barrier-to-barrier window; the medians are over the interleaved repeats
    med = {k: statistics.median(max(r[k][i] for r in res) for i in range(args.repeat))
           for k in ("fresh_s", "refresh_s", "p2p_s", "links_s")}
    out = {
        "exact": all(r["exact"] for r in res),
        "bytes": plan.bytes,
        "seconds": med["fresh_s"],
        "gbps": plan.bytes / med["fresh_s"] / 1e9,
        "p2p_gbps": p2p_bytes / med["p2p_s"] / 1e9,
        "refresh_seconds": med["refresh_s"],
        "refresh_gbps": plan.bytes / med["refresh_s"] / 1e9,
        # the same per-link bytes as plain concurrent messages: the limit for this traffic pattern
        "links_gbps": plan.bytes / med["links_s"] / 1e9 if plan.bytes else 0.0,
        "model": args.model, "from": str(src), "to": str(dst), "dtype": args.dtype, "world": world,
        "sent_by_ranks": sum(r["sent"] for r in res),
        "local_copy_bytes": sum(r["copied"] for r in res),
        "links": len(links),
        "max_link_bytes": max(links.values(), default=0),
        "rounds": max(r["rounds"] for r in res),
        "peak_buffer_bytes": max(r["peak_buffer_bytes"] for r in res),
        # where the slowest rank's time went (last run): packing, waiting for messages, unpacking,
        # local copies (made while the first round is on the wire)
        **{k: max(r[k] for r in res) for k in ("pack_s", "wait_s", "unpack_s", "copy_s")},
    }
    _print_realloc(out, args.json)
    return 0 if out["exact"] and out["sent_by_ranks"] == out["bytes"] else 1


def _realloc_ranks(cfg, args, world: int, bucket_bytes: int, p2p: tuple[int, int, int]) -> list[dict]:
    from ..realloc.bench import move_and_check  # lazy: --help and `meshrl plan` load no torch

    with RankPool(world, timeout=args.timeout) as pool:
        return pool.run(move_and_check, cfg, args.src, args.dst, args.value_head, args.seed, args.dtype,
                        bucket_bytes, args.repeat, args.timeout, p2p)


def _print_realloc(out: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(out))
        return
    print(f"realloc {out['model']} {out['from']} -> {out['to']} ({out['dtype']}, {out['world']} local ranks)")
    print(f"  exact          {out['exact']}")
    mb = {k: out[k] / 1e6 for k in ("bytes", "local_copy_bytes", "max_link_bytes")}
    print(f"  bytes moved    {mb['bytes']:.1f} MB over {out['links']} links "
          f"(local copies {mb['local_copy_bytes']:.1f} MB, busiest link {mb['max_link_bytes']:.1f} MB)")
    print(f"  time           {out['seconds'] * 1e3:.1f} ms in {out['rounds']} rounds (fresh copy), "
          f"{out['refresh_seconds'] * 1e3:.1f} ms (refresh in place); medians")
    p2p, links = out["p2p_gbps"], out["links_gbps"] or float("nan")
    print(f"  bandwidth      {out['gbps']:.3f} GB/s fresh, {out['refresh_gbps']:.3f} GB/s refresh")
    print(f"  vs p2p         {p2p:.3f} GB/s one link: ratios {out['gbps'] / p2p:.2f} fresh, "
          f"{out['refresh_gbps'] / p2p:.2f} refresh")
    print(f"  vs plain links {links:.3f} GB/s (same bytes per link, plain messages): ratios "
          f"{out['gbps'] / links:.2f} fresh, {out['refresh_gbps'] / links:.2f} refresh")


Bench = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
def _generate_args(p: argparse.ArgumentParser) -> None:
    from .bench_generate import add_args  # lazy: the name add_args is a loop variable below

    add_args(p)


def _generate_run(args: argparse.Namespace) -> int:
    from .bench_generate import run as run_generate  # lazy: --help and `meshrl plan` load no torch

    return run_generate(args)


BENCHES: dict[str, Bench] = {
    "realloc": ("move a model between two layouts, check it, and compare with p2p bandwidth",
                _realloc_args, _realloc_run),
    "generate": ("generation tokens/s of one backend (meshrl or vllm) after a warm-up call",
                 _generate_args, _generate_run),
}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmarks measured against the hardware limit",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="bench", metavar="BENCH", help="the benchmark to run")
    for name, (help_, add_args, _) in BENCHES.items():
        add_args(sub.add_parser(name, help=help_, description=help_))


def run(args: argparse.Namespace) -> int:
    if args.bench is None:
        raise UserError(f"choose a benchmark: {', '.join(BENCHES)}")
    return BENCHES[args.bench][2](args)
