"""``meshrl train [CONFIG.yaml] [key=value ...] [--nprocs N] [--plan P] [--out DIR] [--resume]``: run an
algorithm on the runtime (one rank in this process unless --nprocs or torchrun); with no arguments, the
built-in demo (a quick SFT, then PPO on single-digit addition with the tiny model)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cpu_features import bf16_by_default
from ..errors import UserError
from .config_help import config_epilog
from ..config import dump_yaml
from .rundir import check_out, check_resume_config, clear_run
import os
import sys
from ..plan.strategies import BUILDERS
from ..runtime.plans import resolve_plan
from ..plan.lag import with_lag

DEFAULT_OUT = "runs/demo"
# The built-in demo's sizes per algorithm, applied before the user's own overrides when there is
# no config file (measured on 2 CPU cores; see docs/algorithms.md). Critic-free algorithms sample
# 4 responses per prompt; with 32 prompts (128 sequences) GRPO's reward rises about as fast as
# PPO's, while 16 prompts left it within noise for one seed of three.
DEMO_DEFAULTS: dict[str, list[str]] = {
    "ppo": ["train.iterations=80", "data.batch_size=64"],
    "grpo": ["train.iterations=60", "data.batch_size=32"],
    "rloo": ["train.iterations=60", "data.batch_size=32"],
    "remax": ["train.iterations=80", "data.batch_size=64"],
    "sft": ["train.iterations=150", "data.batch_size=64"],
    "rm": ["train.iterations=300", "data.batch_size=64"],
    "dpo": ["train.iterations=60", "data.batch_size=32"],
}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train with an RLHF algorithm (no arguments: the CPU demo)",
                              description=__doc__, epilog=config_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    # argparse cannot take positionals on both sides of an option inside a subcommand, so the
    # rest of the line is re-parsed in run() with parse_intermixed_args.
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value",
                   help="an optional YAML config first, then dotted overrides such as algo=grpo")
    p.add_argument("--out", default=None, help=f"output directory (default: {DEFAULT_OUT} for the demo, "
                   "runs/<algo> otherwise)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar; one plain line per iteration")
    p.add_argument("--nprocs", type=int, default=None,
                   help="run on N local ranks (gloo on CPU, NCCL on GPUs); default 1, in this process")
    p.add_argument("--plan", default=None, metavar="STRATEGY|FILE.json",
                   help="colocated | interleaved | disaggregated | heuristic | search | a plan file "
                   "(default: colocated)")
    p.add_argument("--replan-every", type=int, default=None, metavar="N",
                   help="every N iterations refit each call's cost from this run's measurements, re-plan "
                   "(search) and switch plans when that gains more than replan.min_gain (sets replan.every)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out (the "
                   "same command; train.iterations may be raised, --nprocs and --plan may change)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (without it, an existing run is refused)")


def _reparse(args: argparse.Namespace) -> argparse.Namespace:
    inner = argparse.ArgumentParser(prog="meshrl train", add_help=False)
    _add_arguments(inner)
    try:
        more = inner.parse_intermixed_args(args.rest)
    except SystemExit:
        raise UserError(f"cannot parse arguments {' '.join(args.rest)!r}; see meshrl train --help") from None
    return argparse.Namespace(items=args.items + more.items, out=more.out or args.out,
                              no_progress=args.no_progress or more.no_progress,
                              nprocs=more.nprocs if more.nprocs is not None else args.nprocs,
                              plan=more.plan or args.plan,
                              replan_every=more.replan_every if more.replan_every is not None else args.replan_every,
                              resume=args.resume or more.resume, overwrite=args.overwrite or more.overwrite)


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """A first item without '=' is the config file; all the others must be key=value."""
    config = None
    if items and "=" not in items[0]:
        config, items = items[0], items[1:]
    bad = [i for i in items if "=" not in i]
    if bad:
        raise UserError(f"expected key=value overrides after the config file, got {bad[0]!r}")
    return config, items


def sizes_line(cfg) -> str:
    """What each size means for this run (users of RLHF systems ask for exactly this)."""
    d, p = cfg.data, cfg.ppo
    if cfg.algo in ("sft", "rm", "dpo"):
        unit = "sequences" if cfg.algo == "sft" else "preference pairs"
        return f"sizes: {d.batch_size} {unit} per step, {cfg.train.iterations} steps"
    seqs = d.batch_size * d.samples_per_prompt
    k = cfg.train.off_policy
    streamed = cfg.stream_steps_at(k) if isinstance(k, int) else 0  # auto: the lag is chosen at launch
    return (f"sizes: {d.batch_size} prompts x {d.samples_per_prompt} samples = {seqs} sequences per iteration; "
            f"{p.epochs} epoch(s) of {p.mini_batches} mini-batches (~{seqs // p.mini_batches} sequences, one "
            f"optimizer step each); {p.micro_batches} micro-batch(es) per mini-batch; "
            f"{cfg.train.iterations} iterations; prompt <= {d.prompt_len} tokens, response <= {d.gen_len}"
            + (f" a turn; multi-turn: <= {cfg.env.max_turns} turns, trajectory <= {cfg.env.max_tokens} tokens "
               f"(env.fn={cfg.env.fn})" if cfg.env.fn else "")
            + (f"; generation streamed {streamed} tokens a policy version, sequences in flight continuing "
               f"under new weights (train.stream_steps={cfg.train.stream_steps})" if streamed else ""))


def run_config(config: str | None, overrides: list[str]):
    """(the run's config, whether it is the built-in demo): with no config file and no data.path, the
    demo's sizes for the algorithm (DEMO_DEFAULTS), then the user's overrides on top."""
    from .settings import load_settings  # lazy: --help and `meshrl plan` load no torch

    cfg = load_settings(config, overrides)
    is_demo = config is None and cfg.data.path is None
    if is_demo:
        cfg = load_settings(None, DEMO_DEFAULTS[cfg.algo] + overrides)
    return cfg, is_demo


def run(args: argparse.Namespace) -> int:
    from ..algo.inputs import check_inputs  # lazy: --help and `meshrl plan` load no torch
    from ..algo.setup import warmup_plan  # lazy: --help and `meshrl plan` load no torch

    args = _reparse(args)
    config, overrides = split_items(args.items)
    if args.replan_every is not None:
        overrides = [*overrides, f"replan.every={args.replan_every}"]
    cfg, is_demo = run_config(config, overrides)
    out = Path(args.out or (DEFAULT_OUT if is_demo and cfg.algo == "ppo" else f"runs/{cfg.algo}"))
    rank0 = _rank0()  # under torchrun only global rank 0 looks at and writes OUT (the others would race it)
    if rank0:
        check_out(out, args.resume, args.overwrite)
    if args.resume:
        cfg = resumed_lag(out, cfg)
        check_resume_config(out, cfg)
    if args.nprocs is not None and args.nprocs < 1:
        raise UserError(f"--nprocs must be >= 1, got {args.nprocs}")
    check_inputs(cfg)  # every model, dataset and rule now, before any warm-up or rank starts
    check_plan_spec(cfg, args.plan, args.nprocs or 1)
    bf16_by_default()  # a bad $MESHRL_CPU_BF16 stops the run here, before OUT holds anything
    if rank0:
        if args.overwrite:
            clear_run(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(dump_yaml(cfg))

    note = warmup_plan(cfg)[1]
    if note:
        print(f"note: {note}")
    return run_job(cfg, args, out, is_demo)


def resumed_lag(out: Path, cfg):
    """``train.off_policy=auto`` on --resume: the lag the run chose when it started (OUT/config.yaml
    records it), never a new choice (the lag changes the numbers)."""
    from ..runtime.job import saved_lag  # lazy: --help and `meshrl plan` load no torch

    k = saved_lag(out) if cfg.train.off_policy == "auto" else None
    return cfg if k is None else with_lag(cfg, k)


def _rank0() -> bool:
    """Whether this process is the job's console and OUT writer: always, except under torchrun."""
    from ..runtime.job import under_torchrun  # lazy: --help and `meshrl plan` load no torch

    return not under_torchrun() or os.environ.get("RANK") == "0"


def check_plan_spec(cfg, spec: str | None, world: int) -> None:
    """``--plan``: a strategy that can place this run, or a plan file that exists, parses and fits it,
    checked before anything is written (a refused start leaves no run behind in --out); under torchrun
    the world is the job's. A search is run by the job itself (it can take a while)."""
    spec = "colocated" if spec is None else spec  # an empty --plan is a slip, not the default
    if spec == "search":
        return
    if spec not in BUILDERS and not Path(spec).is_file():
        if spec.endswith(".json") or "/" in spec or Path(spec).exists():
            raise UserError(f"--plan: plan file not found: {spec}")
        raise UserError(f"--plan: unknown strategy {spec!r}; known: {', '.join([*BUILDERS, 'search'])}, "
                        "or a plan file (FILE.json)")

    resolve_plan(cfg, spec, int(os.environ.get("WORLD_SIZE", world)))


def dtype_line(name: str) -> str:
    """The header's precision line: train.dtype, and what auto chose on this machine."""
    from ..parallel.precision import AUTO_RULE, torch_dtype  # lazy: --help and `meshrl plan` load no torch

    got = str(torch_dtype(name)).removeprefix("torch.")
    return f"dtype: {got}" + (f" ({AUTO_RULE})" if name == "auto" else "")


def run_job(cfg, args: argparse.Namespace, out: Path, is_demo: bool) -> int:
    """Every run is the runtime (meshrl/runtime/job.py): one rank in this process by default,
    ``--nprocs N`` local ranks, or the ranks of a torchrun job; all write the same OUT/ and resume."""
    from ..observe.metrics import eval_summary  # lazy: --help and `meshrl plan` load no torch
    from ..runtime.job import (  # lazy: --help and `meshrl plan` load no torch
        launch, local_ranks, threads_per_rank, under_torchrun)

    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (args.nprocs or 1)
    rank0 = _rank0()
    if rank0:
        demo = " (built-in demo: single-digit addition, tiny model)" if is_demo else ""
        print(f"meshrl train: algo={cfg.algo}{demo} on {world} rank{'s' if world > 1 else ''}")
        print(sizes_line(cfg))
        threads, why = threads_per_rank(cfg, local_ranks(world))
        print(f"threads: {threads} per rank ({why})")
        print(dtype_line(cfg.train.dtype))
    # rank 0's progress bar, in a process of its own when there are several, stops mid-line
    cut = "\n" if world > 1 and not args.no_progress and not under_torchrun() else ""
    try:
        records = launch(cfg, args.plan or "colocated", world, out, resume=args.resume,
                         progress=not args.no_progress)
    except RuntimeError as e:
        print(f"{cut}meshrl train: the job failed and was stopped: {e}")
        return 1
    except KeyboardInterrupt:
        print(f"{cut}meshrl train: interrupted; {resume_hint(out)}", file=sys.stderr)
        return 130
    if not rank0:
        return 0
    if records and "reward/mean" in records[-1]:
        print(f"reward/mean: {records[0]['reward/mean']:.3f} at iteration {records[0]['iteration']} -> "
              f"{records[-1]['reward/mean']:.3f} at iteration {records[-1]['iteration']}")
    trained = "reward" if cfg.algo == "rm" else "actor"
    warm = ", sft-warmup/ (the SFT warm-up's actor)" if (out / "sft-warmup").is_dir() else ""
    print(f"outputs in {out}/: config.yaml, plan.json, metrics.jsonl, tensorboard/ (tensorboard --logdir {out}), "
          f"trace.json (Perfetto), ckpt-*/ (--resume), {trained}/ (Hugging Face checkpoint){warm}")
    if is_demo and cfg.algo not in ("sft", "rm", "dpo") and (out / "actor").is_dir():
        print(heldout_line(out, cfg.algo))  # the demo's last line, from the saved actors
    elif records and eval_summary(records):
        print("\n".join(eval_summary(records)))  # a run with eval.path ends with its evaluations
    return 0


def resume_hint(out: Path) -> str:
    """What an interrupted run's directory keeps, and how to go on from it."""
    from ..runtime.checkpoint import latest_checkpoint  # lazy: --help and `meshrl plan` load no torch

    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return f"{out}/ holds no checkpoint yet: the same command with --resume starts from the beginning"
    return f"{out}/ keeps {ckpt.name}: the same command with --resume continues from it"


def heldout_accuracy(model_dir: Path) -> tuple[int, int]:
    """(right, asked): the saved actor's greedy answers to the demo's held-out problems, which no stage
    trained on (meshrl/data/demo.py), checked by the rule."""
    from ..data import demo  # lazy: --help and `meshrl plan` load no torch
    from ..model import (  # lazy: --help and `meshrl plan` load no torch
        ByteTokenizer, GenerationConfig, generate, load_pretrained)

    records = demo.prompts("heldout")
    tok, model = ByteTokenizer(), load_pretrained(model_dir).eval()
    out = generate(model, [tok.encode(r["prompt"], add_bos=True) for r in records],
                   GenerationConfig(max_new_tokens=4, greedy=True, eos_token_id=tok.eos_token_id,
                                    pad_token_id=tok.pad_token_id))
    answers = [tok.decode([t for t in row if t != tok.eos_token_id]).strip() for row in out.responses.tolist()]
    return sum(a == r["answer"] for a, r in zip(answers, records, strict=True)), len(records)


def heldout_line(out: Path, algo: str) -> str:
    """The demo's last line: held-out accuracy before RL (the SFT warm-up's actor) and after."""
    right, n = heldout_accuracy(out / "actor")
    head = f"held-out accuracy ({n} problems no stage trained on, greedy): "
    after = f"{right}/{n} after {algo.upper()}"
    if not (out / "sft-warmup").is_dir():
        return head + after
    before, _ = heldout_accuracy(out / "sft-warmup")
    return head + f"{before}/{n} after the SFT warm-up -> {after}"
