"""``meshrl generate``: complete a prompt with a checkpoint directory (or a preset, for a smoke test).

    meshrl generate --model DIR --prompt TEXT [--max-new-tokens N] [--greedy]
                    [--temperature T] [--top-k K] [--top-p P] [--seed S]

DIR is a Hugging Face checkpoint directory with a tokenizer (tokenizer.json, or the byte-tokenizer
mark that meshrl writes for its demo models). A preset name instead of DIR builds that preset with
random weights (seed 0) and the byte tokenizer: the output is noise, but every code path runs.
Only the completion is printed, on stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UserError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="complete a prompt with a model",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint directory, or a preset name (random weights)")
    p.add_argument("--prompt", required=True, help="text to complete")
    p.add_argument("--max-new-tokens", type=int, default=32, help="most tokens to generate (default 32)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same seed gives the same text)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="dtype the model runs in (default float32)")


def _load(model_arg: str, dtype):
    """-> (model, tokenizer) from a checkpoint directory or a preset name."""
    from ..model import ByteTokenizer, build_model, load_pretrained, load_tokenizer
    from ..model.presets import PRESETS

    if Path(model_arg).is_dir():
        return load_pretrained(model_arg, dtype=dtype), load_tokenizer(model_arg)
    if model_arg in PRESETS:
        return build_model(model_arg, seed=0, dtype=dtype), ByteTokenizer()
    raise UserError(f"--model {model_arg!r} is neither a checkpoint directory nor a preset "
                    f"(presets: {', '.join(PRESETS)})")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..model import GenerationConfig, generate

    model, tok = _load(args.model, getattr(torch, args.dtype))
    ids = tok.encode(args.prompt)
    if not ids:
        raise UserError("--prompt encodes to no tokens")
    vocab = model.config.vocab_size
    if max(ids) >= vocab:
        raise UserError(f"the tokenizer gives id {max(ids)}, beyond the model's vocab_size={vocab}: "
                        "tokenizer and model do not belong together")
    eos = tok.eos_token_id if tok.eos_token_id is not None else model.config.eos_token_id
    pad = next(t for t in (tok.pad_token_id, eos, 0) if t is not None)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, greedy=args.greedy,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                           eos_token_id=eos, pad_token_id=pad)
    out = generate(model, [ids], cfg, seeds=[args.seed])
    n = int(out.response_mask[0].sum())
    print(tok.decode(out.responses[0, :n].tolist()))
    return 0
