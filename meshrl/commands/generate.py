"""``meshrl generate``: complete prompts with a checkpoint directory (or a preset, for a smoke test).

    meshrl generate --model DIR --prompt TEXT [--max-new-tokens N] [--greedy]
                    [--temperature T] [--top-k K] [--top-p P] [--seed S] [--compile]
    meshrl generate --model DIR --prompts FILE.jsonl [--batch-size B] [--chat] [--json] [...]

DIR is a Hugging Face checkpoint directory with a tokenizer (tokenizer.json, or the byte-tokenizer
mark that meshrl writes for its demo models). A preset name instead of DIR builds that preset with
random weights (seed 0) and the byte tokenizer: the output is noise, but every code path runs.

A prompt is encoded exactly as training and evaluation encode it (meshrl.data.encode.prompt_ids:
the tokenizer's own special tokens, so BOS where the tokenizer adds one). FILE.jsonl holds one JSON
object a line, {"prompt": TEXT} or, with --chat, {"messages": [{"role": ..., "content": ...}]}
(a "prompt" then becomes one user message; a "prompt" that is a list of messages, TRL's
conversational format, is "messages"), or FILE.parquet one such record a row; --chat renders the
checkpoint's chat template (meshrl/data/chat.py, as training does) and stops a reply at the
template's end of turn.
Row i samples from seed (S, i) only, so a completion does not depend on --batch-size.
Without --json the completions are printed one after another; --json prints one object
{"completions": [TEXT, ...], "tokens_per_s": F, "seconds": F, "dtype": D} (input order; seconds =
generation only, not loading; tokens counted up to and including end-of-sequence).
--dtype auto (the default) takes train.dtype=auto's rule: bfloat16 on a CPU with bf16 dot products,
float32 elsewhere; the choice goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..model.presets import PRESETS
from ..data.chat import load_chat_template
from ..data.dataset_file import PARQUET, read_dataset
from ..data.peer_fields import peer_fields
from ..cores import rank_threads
from ..cpu_features import auto_dtype
from ..data.chat import end_of_turn_id


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="complete prompts with a model",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint directory, or a preset name (random weights)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one text to complete")
    src.add_argument("--prompts", metavar="FILE.jsonl", help='one {"prompt": TEXT} (or {"messages": [...]}) a line '
                     "(or a .parquet file, a row each)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate at most per prompt")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample in the nucleus of mass P (1.0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same seed gives the same text)")
    p.add_argument("--batch-size", type=int, default=32, help="prompts generated together (speed only)")
    p.add_argument("--chat", action="store_true", help="apply the checkpoint's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object (completions, tokens/s, seconds)")
    p.add_argument("--compile", action="store_true", help="run the decode step through torch.compile")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0 = auto as train.threads: $OMP_NUM_THREADS if set, else usable cores)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="parameter dtype; auto as train.dtype=auto: bfloat16 on a CPU with bf16 dot products "
                        "(the faster there on models of 3M parameters and more), else float32")


AUTO_WHY = {"bfloat16": "this CPU has bf16 dot products", "float32": "this CPU has no bf16 dot products"}


def dtype_name(model) -> str:
    """The dtype a loaded model runs in, as --dtype names it (the JSON's "dtype")."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def resolve_dtype(name: str) -> str:
    """--dtype as a torch dtype name: ``auto`` is train.dtype=auto's rule on a CPU
    (cpu_features.auto_dtype; $MESHRL_CPU_BF16 overrides it as there)."""
    return auto_dtype(gpu=False) if name == "auto" else name


def _load(model_arg: str, dtype):
    """-> (model, tokenizer) from a checkpoint directory or a preset name."""
    from ..model import (  # lazy: --help and `meshrl plan` load no torch
        ByteTokenizer, build_model, load_pretrained, load_tokenizer)

    if Path(model_arg).is_dir():
        return load_pretrained(model_arg, dtype=dtype), load_tokenizer(model_arg)
    if model_arg in PRESETS:
        return build_model(model_arg, seed=0, dtype=dtype), ByteTokenizer()
    raise UserError(f"--model {model_arg!r} is neither a checkpoint directory nor a preset "
                    f"(presets: {', '.join(PRESETS)})")


def read_prompts(path: str, chat: bool) -> list[str | list[dict]]:
    """FILE.jsonl (or FILE.parquet) -> per record a text, or (chat) a list of messages. Errors name
    the line (row). TRL's conversational prompts (a list of messages) count as "messages"."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"--prompts: no file at {path}")
    out = [_prompt(peer_fields(rec, "prompts"), where, chat) for where, rec in _records(file)]
    if not out:
        raise UserError(f"--prompts {path}: no prompts in the file")
    return out


def _records(file: Path) -> list[tuple[str, object]]:
    """(where, decoded record) per non-blank line of a JSONL file or row of a Parquet file."""
    if file.suffix.lower() in PARQUET:
        return [(f"{file}:row {n}", rec) for n, rec in enumerate(read_dataset(file, "prompts"), 1)]
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prompts {file}: cannot read ({e})") from None
    out: list[tuple[str, object]] = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append((f"{file}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise UserError(f"{file}:{n}: not JSON ({e.msg})") from None
    return out


def _prompt(rec: object, where: str, chat: bool) -> str | list[dict]:
    if not isinstance(rec, dict) or not ({"prompt", "messages"} & set(rec)):
        raise UserError(f'{where}: expected an object with "prompt" (or "messages" with --chat)')
    if "messages" in rec:
        msgs = rec["messages"]
        if not chat:
            raise UserError(f'{where}: "messages" needs --chat (the chat template renders them)')
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs):
            raise UserError(f'{where}: "messages" must be a non-empty list of {{"role", "content"}} strings')
        return msgs
    if not isinstance(rec["prompt"], str):
        raise UserError(f'{where}: "prompt" must be a string')
    return [{"role": "user", "content": rec["prompt"]}] if chat else rec["prompt"]


def encode_all(tok, model_dir: str, items: list, chat: bool) -> list[list[int]]:
    """Prompt texts (or, with chat, conversations) -> token ids, as training encodes them."""
    from ..data.encode import prompt_ids  # lazy: --help and `meshrl plan` load no torch

    if not chat:
        return [prompt_ids(tok, text) for text in items]

    # The rendered template carries its own special tokens (BOS included), as transformers'
    # apply_chat_template(tokenize=True) does, and as training encodes a chat record: add none.
    template = load_chat_template(model_dir)
    return [prompt_ids(tok, template.render_messages(msgs), special_tokens=False) for msgs in items]


def run(args: argparse.Namespace) -> int:
    model, tok, prompts, cfg = prepare(args)
    texts, tokens, seconds = complete(meshrl_engine(model.eval()), prompts, cfg, args.seed, args.batch_size,
                                      lambda ids: tok.decode(ids))
    if args.json:
        print(json.dumps({"completions": texts, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                          "seconds": seconds, "dtype": dtype_name(model)}))
    else:
        for text in texts:
            print(text)
    return 0


def prepare(args: argparse.Namespace):
    """-> (model, tokenizer, prompt token ids, GenerationConfig) of the command line, checked."""
    import torch  # lazy: --help and `meshrl plan` load no torch

    from ..model import GenerationConfig  # lazy: --help and `meshrl plan` load no torch

    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--batch-size", args.batch_size)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    if args.threads < 0:
        raise UserError(f"--threads must be >= 0 (0 = auto), got {args.threads}")
    if args.chat and not Path(args.model).is_dir():
        raise UserError("--chat needs a checkpoint directory with a chat template, not a preset")
    items = read_prompts(args.prompts, args.chat) if args.prompts is not None else (
        [[{"role": "user", "content": args.prompt}]] if args.chat else [args.prompt])
    torch.set_num_threads(rank_threads(args.threads, 1)[0])  # one process: every usable core by default
    dtype = resolve_dtype(args.dtype)
    model, tok = _load(args.model, getattr(torch, dtype))
    prompts = encode_all(tok, args.model, items, args.chat)
    for i, (item, ids) in enumerate(zip(items, prompts, strict=True)):
        if not ids or item == "":  # an empty text is a slip, even where BOS alone could be a prompt
            raise UserError(f"{'--prompt' if args.prompts is None else f'prompt {i + 1}'} is empty "
                            "(encodes to no tokens of its own)")
        if max(ids) >= model.config.vocab_size:
            raise UserError(f"the tokenizer gives id {max(ids)}, beyond the model's vocab_size="
                            f"{model.config.vocab_size}: tokenizer and model do not belong together")
    eos = tok.eos_token_id if tok.eos_token_id is not None else model.config.eos_token_id
    if args.chat:  # a reply ends at the template's end of turn, as in training (algo/rollout.py)
        eos = end_of_turn_id(args.model, tok)
    pad = next(t for t in (tok.pad_token_id, eos, 0) if t is not None)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, greedy=args.greedy, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, eos_token_id=eos, pad_token_id=pad,
                           compile=args.compile)
    cfg.validate()
    if args.dtype == "auto":  # the choice, on stderr: stdout holds only the completions (or the JSON)
        print(f"dtype: {dtype} (--dtype auto: {AUTO_WHY[dtype]})", file=sys.stderr)
    return model, tok, prompts, cfg


def meshrl_engine(model):
    """meshrl's engine on a whole model, as ``complete`` calls an engine: (prompts, cfg, seeds) -> output."""
    from ..model import generate  # lazy: --help and `meshrl plan` load no torch

    return lambda prompts, cfg, seeds: generate(model, prompts, cfg, seeds=seeds)


def complete(engine, prompts: list[list[int]], cfg, seed: int, batch_size: int, decode
             ) -> tuple[list[str], int, float]:
    """Generate in batches of similar length; -> (texts in input order, tokens generated, seconds).

    ``engine(prompts, cfg, seeds)`` is meshrl's (``meshrl_engine``) or a Generator's ``generate``.
    Rows are batched by prompt length (less padding); each row's seed is (seed, input index), and
    sampling is batch-invariant, so the grouping changes speed only."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts: list[str] = [""] * len(prompts)
    tokens, seconds = 0, 0.0
    for lo in range(0, len(order), batch_size):
        rows = order[lo:lo + batch_size]
        t0 = time.perf_counter()
        out = engine([prompts[i] for i in rows], cfg, [(seed << 32) + i for i in rows])
        seconds += time.perf_counter() - t0
        lens = out.response_mask.sum(1).tolist()
        tokens += int(sum(lens))
        for r, i in enumerate(rows):
            texts[i] = decode(out.responses[r, :int(lens[r])].tolist())
    return texts, tokens, seconds
