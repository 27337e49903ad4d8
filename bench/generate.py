"""Our model against transformers on the same weights, in one run: batched greedy generation
(tokens/s, eager and with gen.compile) and one training step (forward + backward of a causal-LM loss).

    python bench/generate.py [--preset llama-3m|tiny|small] [--batch 1,8,32] [--new-tokens 32] [--repeats 5]
                             [--threads 1] [--dtype auto|float32|bfloat16] [--hf-dtype fastest|same|float32|bfloat16]
                             [--no-compile] [--skip-train]
    python bench/generate.py --model DIR [--batch 8,32] [--new-tokens 64]   (a chat model: SmolLM2's prompts)
    python bench/generate.py --backend meshrl,vllm [--model DIR | --preset llama-3m] [--batch 8,32,64]
                             [--dtype float32,bfloat16] [--new-tokens 64] [--grpo CONFIG.yaml]

The second form generates from a chat checkpoint on both sides (its held-out prompts, rows stopping
at its end of turn); the third compares meshrl's engine with vLLM instead of transformers (bench/backends.py).

``--dtype auto`` (the default) is meshrl at its default dtype (``train.dtype=auto``'s rule, as
``meshrl generate --dtype auto``: bf16 on a CPU with bf16 dot products, else float32), and
``--hf-dtype fastest`` (the default) times transformers at float32 and at bfloat16, each side by
side with meshrl: the ratio that counts is against transformers' faster dtype (its tokens differ
from meshrl's where the dtypes do). ``--hf-dtype same`` gives both sides one dtype (the same
tokens: the engines' numerics compared too).

Both sides get the same checkpoint (saved by meshrl, read by transformers), the same left-padded
prompts of different lengths, the same thread count; runs alternate ours/theirs so that noise from
other processes hits both alike. Prints medians of wall time and of CPU time (the steadier one on a
shared machine) and the ratios (> 1 means meshrl is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

# Transparent huge pages for torch's CPU allocator: read once when torch loads, so set it before the
# import. Without it, on this machine, a GEMV over freshly allocated 100 MB weights ran ~2x slower
# than over the same weights mmapped from a safetensors file (see docs/model.md). Both sides get it.
if "--no-thp" not in sys.argv:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _prompts(batch: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.linspace(lo, hi, batch).round().long().tolist()  # different lengths: RLHF's normal case
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def _left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _time(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process). On a machine shared with other jobs, CPU time
    is the steadier measure of work (with --threads 1 it excludes time spent waiting for a core)."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _alternate(ours, theirs, repeats: int) -> dict[str, float]:
    """Run ours/theirs alternately so noise from other processes hits both alike; medians."""
    runs: dict[str, list[float]] = {"ours_wall": [], "ours_cpu": [], "hf_wall": [], "hf_cpu": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("hf", theirs)):
            wall, cpu = _time(fn)
            runs[f"{name}_wall"].append(wall)
            runs[f"{name}_cpu"].append(cpu)
    return {k: statistics.median(v) for k, v in runs.items()}


def _completions(rows: torch.Tensor, eos: int | None) -> list[list[int]]:
    """Each row's tokens up to and including its first ``eos`` (all of them without one)."""
    out = []
    for r in rows.tolist():
        out.append(r[:r.index(eos) + 1] if eos is not None and eos in r else r)
    return out


def bench_generate(ours, theirs, prompts, new_tokens: int, repeats: int, compile: bool = False,
                   eos: int | None = None, pad: int = 0) -> dict:
    """Greedy tokens/s of both sides on ``prompts``; with ``eos``, rows stop there (both sides stop
    when every row has) and tokens/s counts each row's tokens up to its EOS."""
    from meshrl.model import GenerationConfig, generate

    cfg = GenerationConfig(max_new_tokens=new_tokens, greedy=True, eos_token_id=eos, pad_token_id=pad,
                           compile=compile)
    ids, mask = _left_pad(prompts)

    def run_ours():
        return generate(ours, prompts, cfg).responses

    @torch.inference_mode()
    def run_theirs():
        out = theirs.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=pad, eos_token_id=eos)
        return out[:, ids.shape[1]:]

    mine = _completions(run_ours(), eos)  # also the warm-ups (and the compile)
    same = [a == b for a, b in zip(mine, _completions(run_theirs(), eos), strict=True)]
    run_ours()
    t = _alternate(run_ours, run_theirs, repeats)
    n = sum(map(len, mine))
    return {"same_tokens": all(same), "same_share": sum(same) / len(same), "tokens": n,
            **{f"{k}_tok_s": n / v for k, v in t.items()}}


def preset_models(preset: str, dtype, hf_dtypes):
    """Both sides' models of a preset with random weights (spread: std 0.1), read by both from one
    checkpoint directory so that their weights live in the same kind of memory; neither stops at EOS.
    -> (meshrl's model in ``dtype``, {dtype name: transformers' model} for ``hf_dtypes``)."""
    import transformers
    from bench_models import MODELS

    from meshrl.model import load_pretrained
    from meshrl.model.transformer import CausalLM

    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        model = CausalLM(MODELS[preset])
        with torch.no_grad():  # spread the logits (std 0.1) so greedy decoding is far from ties
            for p in model.parameters():
                p.normal_(0.0, 0.1) if p.dim() > 1 else p.fill_(1.0)
        model.save_pretrained(d)
        ours = load_pretrained(d).to(dtype).eval()
        theirs = {n: transformers.AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, n)).eval()
                  for n in hf_dtypes}
    # All rows decode new_tokens tokens (a forced min_new_tokens would instead forbid EOS on
    # transformers' side only, and its tokens would differ where EOS wins).
    for m in theirs.values():
        m.generation_config.eos_token_id = None
    return ours, theirs


def checkpoint_workload(path: str, batch: int, dtype, hf_dtypes):
    """SmolLM2-like checkpoint directory: meshrl's model, transformers' per dtype of ``hf_dtypes``,
    its chat-encoded held-out prompts (bench/backends.py's), its end-of-turn id and pad id."""
    import transformers
    from backends import _workload

    ours, prompts, cfg = _workload(path, batch, 1, (0, 0), dtype)
    theirs = {n: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, n)).eval()
              for n in hf_dtypes}
    return ours, theirs, prompts, cfg.eos_token_id, cfg.pad_token_id


def bench_train(ours, theirs, batch: int, seq: int, vocab: int, repeats: int) -> dict:
    ids = torch.randint(3, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))

    def step(model, get_logits):
        model.zero_grad(set_to_none=True)
        logits = get_logits(model)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        return loss.item()

    def run_ours():
        return step(ours, lambda m: m(ids))

    def run_theirs():
        return step(theirs, lambda m: m(ids).logits)

    loss_diff = abs(run_ours() - run_theirs())  # also the warm-up
    return {"loss_abs_diff": loss_diff, **_alternate(run_ours, run_theirs, repeats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-3m", help="llama-3m (the GRPO benchmark's model) or a meshrl preset")
    ap.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", default="16,64", help="min,max prompt length")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--train-batch", type=int, default=4)
    ap.add_argument("--train-seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (0 = torch's default); 1 makes CPU time a clean measure of work")
    ap.add_argument("--dtype", default="auto",
                    help="meshrl's weights and activations: auto (its default: bf16 on a CPU with bf16 dot "
                         "products, else float32), float32 or bfloat16; with --backend a list of both")
    ap.add_argument("--hf-dtype", default="fastest",
                    help="transformers' dtype: fastest (float32 and bfloat16, each timed side by side), "
                         "same (--dtype's), float32 or bfloat16")
    ap.add_argument("--no-compile", action="store_true", help="skip the gen.compile rows")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--no-thp", action="store_true", help="leave THP_MEM_ALLOC_ENABLE unset")
    ap.add_argument("--backend", help="meshrl,vllm: compare meshrl's engine with vLLM (bench/backends.py)")
    ap.add_argument("--model", help="a checkpoint directory with a chat template (e.g. SmolLM2, "
                    "examples/smollm2/prepare.py) instead of --preset: its held-out chat prompts, rows stop at "
                    "its end of turn")
    ap.add_argument("--grpo", metavar="CONFIG", help="with --backend: also one GRPO iteration of CONFIG per backend")
    args = ap.parse_args()
    from meshrl.cpu_features import auto_dtype

    if args.backend:
        from backends import compare, grpo_iteration

        dtypes = [auto_dtype(gpu=False) if d == "auto" else d for d in args.dtype.split(",")]
        compare(args.model or args.preset, [int(b) for b in args.batch.split(",")], dtypes,
                args.new_tokens, args.repeats, tuple(map(int, args.prompt_len.split(","))), args.threads)
        if args.grpo:
            grpo_iteration(args.grpo, args.backend.split(","), [])
        return
    if args.dtype not in ("auto", "float32", "bfloat16"):
        ap.error(f"--dtype {args.dtype!r}: auto, float32 or bfloat16 (a list only with --backend)")
    if args.hf_dtype not in ("fastest", "same", "float32", "bfloat16"):
        ap.error(f"--hf-dtype {args.hf_dtype!r}: fastest, same, float32 or bfloat16")
    if args.threads:
        torch.set_num_threads(args.threads)
    from meshrl.host_memory import keep_freed_memory

    keep_freed_memory()  # as `meshrl` does; the process is both sides' (meshrl/host_memory.py)
    name = auto_dtype(gpu=False) if args.dtype == "auto" else args.dtype
    dtype = getattr(torch, name)
    hf_dtypes = {"fastest": ("float32", "bfloat16"), "same": (name,)}.get(args.hf_dtype, (args.hf_dtype,))

    import transformers

    from meshrl.model import num_params

    batches = [int(b) for b in args.batch.split(",")]
    lo, hi = map(int, args.prompt_len.split(","))
    eos, pad = None, 0
    if args.model:
        ours, theirs, all_prompts, eos, pad = checkpoint_workload(args.model, max(batches), dtype, hf_dtypes)
    else:
        ours, theirs = preset_models(args.preset, dtype, hf_dtypes)
    cfg = ours.config
    attn = next(iter(theirs.values())).config._attn_implementation
    print(f"model: {args.model or args.preset!r}, {num_params(cfg) / 1e6:.1f}M parameters; torch {torch.__version__}, "
          f"transformers {transformers.__version__} (attn {attn}); meshrl {name}"
          f"{' (--dtype auto)' if args.dtype == 'auto' else ''}, transformers {' and '.join(hf_dtypes)}; "
          f"{torch.get_num_threads()} threads; "
          f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '')!r}; "
          f"medians of {args.repeats}, ours and transformers alternating")
    for batch in batches:
        if args.model:
            prompts = all_prompts[:batch]
            lo, hi = min(map(len, prompts)), max(map(len, prompts))
        else:
            prompts = _prompts(batch, cfg.vocab_size, lo, hi)
        for compile in (False,) if args.no_compile else (False, True):
            ratios = {}
            for hf_name, model in theirs.items():
                g = bench_generate(ours, model, prompts, args.new_tokens, args.repeats, compile, eos, pad)
                stops = f", stops at end of turn ({g['tokens']} tokens)" if eos is not None else ""
                print(f"generate  batch {batch:3d}, prompts {lo}..{hi} tokens, {args.new_tokens} new tokens{stops}, "
                      f"greedy, gen.compile={str(compile).lower():5s}, meshrl {name} vs transformers {hf_name}; "
                      f"same tokens: {g['same_share']:.0%} of rows")
                for kind in ("wall", "cpu"):
                    o, h = g[f"ours_{kind}_tok_s"], g[f"hf_{kind}_tok_s"]
                    print(f"  by {kind:4s} time: meshrl {o:8.1f} tok/s, transformers {h:8.1f} tok/s, "
                          f"meshrl/transformers {o / h:.2f}x")
                ratios[hf_name] = (g["ours_wall_tok_s"] / g["hf_wall_tok_s"], g["hf_wall_tok_s"])
            if len(ratios) > 1:  # against transformers at its faster dtype on this workload
                fastest = max(ratios, key=lambda k: ratios[k][1])
                print(f"  => meshrl ({name}) / transformers at its fastest ({fastest}): {ratios[fastest][0]:.2f}x "
                      "by wall time")
    if args.skip_train:
        return
    theirs = theirs.get(name, next(iter(theirs.values())))  # the training step: the same dtype where timed
    ours.train()
    theirs.train()
    t = bench_train(ours, theirs, args.train_batch, args.train_seq, cfg.vocab_size, args.repeats)
    print(f"train step  batch {args.train_batch} x {args.train_seq} tokens, forward+backward; "
          f"loss abs diff {t['loss_abs_diff']:.1e}")
    for kind in ("wall", "cpu"):
        o, h = t[f"ours_{kind}"], t[f"hf_{kind}"]
        print(f"  by {kind:4s} time: meshrl {o * 1e3:8.0f} ms, transformers {h * 1e3:8.0f} ms, "
              f"transformers/meshrl {h / o:.2f}x")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
