"""``meshrl bench generate``: generation throughput of one backend after a warm-up call.

    meshrl bench generate --model DIR --prompts FILE.jsonl --batch-size B --max-new-tokens N
                          [--backend meshrl|vllm] [--compile] [--greedy] [--dtype D] [--chat] --json

prints ``{"tokens_per_s", "seconds", "completions", "dtype"}``: the second pass over the prompts, timed (the
first, untimed, is the warm-up: a cold first call, with vLLM's engine start or torch.compile's
tracing, is not a throughput). Tokens are counted up to and including EOS. Both backends get the
same token ids, sampling settings, per-row seeds and batches; bench/generate.py runs them side by
side and compares their greedy completions.
"""

from __future__ import annotations

import argparse
import json

from ..errors import UserError
from .generate import meshrl_engine
from .generate import complete, dtype_name, prepare


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory, or a preset name (random weights)")
    p.add_argument("--prompts", required=True, metavar="FILE.jsonl", help="one prompt a line, as meshrl generate reads")
    p.add_argument("--batch-size", type=int, default=32, help="prompts generated together")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most per prompt")
    p.add_argument("--backend", choices=("meshrl", "vllm"), default="meshrl", help="generation engine")
    p.add_argument("--compile", action="store_true", help="meshrl: the decode step through torch.compile")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample in the nucleus of mass P (1.0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of row i: (seed, i)")
    p.add_argument("--chat", action="store_true", help="apply the checkpoint's chat template")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = every usable core)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="parameter dtype (auto: as meshrl generate's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(prompt=None)


def engine_for(args: argparse.Namespace, model):
    """The backend's engine as ``complete`` calls it: (prompts, cfg, seeds) -> GenerationOutput."""

    if args.backend == "meshrl":
        return meshrl_engine(model.eval())
    from ..gen.checks import check_backend  # lazy: --help and `meshrl plan` load no torch

    check_backend("vllm", "bench generate", 1, 1, "cpu" if not _cuda() else "cuda", model.config)
    return vllm_bench_engine(model, args.seed)[0]


def vllm_bench_engine(model, seed: int):
    """(generate(prompts, cfg, seeds=None) -> GenerationOutput, close()) of a vLLM engine on
    ``model``'s weights (loaded through meshrl's weight sync) that empties its prefix cache before
    every call, as every weight sync does in a run: a benchmark's timed pass would otherwise reuse
    the KV of its warm-up's identical prompts (rows of one call still share it)."""
    from ..gen.vllm_engine import VllmGenerator  # lazy: --help and `meshrl plan` load no torch

    gen = VllmGenerator(model.config, next(model.parameters()).dtype, seed, model.config.max_position_embeddings)
    gen.load_weights(model.state_dict().items())

    def fresh(prompts, cfg, seeds=None):
        gen.llm.reset_prefix_cache()
        return gen.generate(prompts, cfg, seeds)

    return fresh, gen.close


def _cuda() -> bool:
    import torch  # lazy: --help and `meshrl plan` load no torch

    return torch.cuda.is_available()


def run(args: argparse.Namespace) -> int:
    if args.compile and args.backend != "meshrl":
        raise UserError("--compile is meshrl's engine's setting (vLLM compiles on its own terms)")
    model, tok, prompts, cfg = prepare(args)
    engine = engine_for(args, model)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids)

    complete(engine, prompts, cfg, args.seed, args.batch_size, decode)  # warm-up, untimed
    texts, tokens, seconds = complete(engine, prompts, cfg, args.seed, args.batch_size, decode)
    out = {"tokens_per_s": tokens / seconds if seconds > 0 else 0.0, "seconds": seconds, "completions": texts,
           "dtype": dtype_name(model)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.backend}: {tokens} tokens in {seconds:.2f} s, {out['tokens_per_s']:.1f} tokens/s")
    return 0
