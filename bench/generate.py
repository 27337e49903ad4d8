"""Our model against transformers on the same weights, in one run: batched greedy generation
(tokens/s) and one training step (forward + backward of a causal-LM loss).

    python bench/generate.py [--preset small] [--batch 8] [--new-tokens 64] [--repeats 5]

Both sides get the same checkpoint (saved by meshrl, read by transformers), the same left-padded
prompts of different lengths, the same thread count; runs alternate ours/theirs so that noise from
other processes hits both alike. Prints medians and the ratios (> 1 means meshrl is faster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F


def _prompts(batch: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.linspace(lo, hi, batch).round().long().tolist()  # different lengths: RLHF's normal case
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def _left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_generate(ours, theirs, prompts, new_tokens: int, repeats: int) -> dict:
    from meshrl.model import GenerationConfig, generate

    cfg = GenerationConfig(max_new_tokens=new_tokens, greedy=True, eos_token_id=None, pad_token_id=0)
    ids, mask = _left_pad(prompts)

    def run_ours():
        return generate(ours, prompts, cfg).responses

    @torch.inference_mode()
    def run_theirs():
        out = theirs.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:]

    same = run_ours().tolist() == run_theirs().tolist()  # also the warm-up
    t_ours, t_theirs = [], []
    for _ in range(repeats):
        t_ours.append(_time(run_ours))
        t_theirs.append(_time(run_theirs))
    n = len(prompts) * new_tokens
    return {"same_tokens": same, "ours_tok_s": n / statistics.median(t_ours),
            "hf_tok_s": n / statistics.median(t_theirs)}


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
    t_ours, t_theirs = [], []
    for _ in range(repeats):
        t_ours.append(_time(run_ours))
        t_theirs.append(_time(run_theirs))
    return {"loss_abs_diff": loss_diff, "ours_s": statistics.median(t_ours),
            "hf_s": statistics.median(t_theirs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", default="16,64", help="min,max prompt length")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--train-batch", type=int, default=4)
    ap.add_argument("--train-seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--skip-train", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    from meshrl.model import build_model, num_params

    ours = build_model(args.preset, seed=0)
    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    cfg = ours.config
    lo, hi = map(int, args.prompt_len.split(","))
    print(f"model: preset {args.preset!r}, {num_params(cfg) / 1e6:.1f}M parameters; torch {torch.__version__}, "
          f"transformers {transformers.__version__} (attn {theirs.config._attn_implementation}); "
          f"{torch.get_num_threads()} threads; medians of {args.repeats}")
    g = bench_generate(ours, theirs, _prompts(args.batch, cfg.vocab_size, lo, hi), args.new_tokens, args.repeats)
    print(f"generate  batch {args.batch}, prompts {lo}..{hi} tokens, {args.new_tokens} new tokens, greedy: "
          f"meshrl {g['ours_tok_s']:.1f} tok/s, transformers {g['hf_tok_s']:.1f} tok/s, "
          f"ratio {g['ours_tok_s'] / g['hf_tok_s']:.2f}x; same tokens: {g['same_tokens']}")
    if args.skip_train:
        return
    ours.train()
    theirs.train()
    t = bench_train(ours, theirs, args.train_batch, args.train_seq, cfg.vocab_size, args.repeats)
    print(f"train step  batch {args.train_batch} x {args.train_seq} tokens, forward+backward: "
          f"meshrl {t['ours_s'] * 1e3:.0f} ms, transformers {t['hf_s'] * 1e3:.0f} ms, "
          f"ratio {t['hf_s'] / t['ours_s']:.2f}x; loss abs diff {t['loss_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
