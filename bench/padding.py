"""What padding costs: a padded batch against the real-token work, for an RLHF-like length mix.

    python bench/padding.py [--preset small] [--layers 4] [--batch 16] [--repeats 3] [--backward] [--threads 1]

meshrl batches variable-length sequences by *padding with masks* (transformer.py), and runs the
projections and MLPs of a padded batch on its real tokens only (transformer.Unpad). This measures,
in one run on the same model, the forward (optionally + backward) CPU time of
  masked    one [B, L_max] batch with every pad token computed (Unpad switched off: as before);
  padded    the same batch as the model runs it now (pad tokens skip every matmul but attention's);
  sorted    the same sequences sorted by length and cut into --buckets micro-batches, each padded
            only to its own maximum (what a runtime can do for free: micro-batching is the plan's);
  alone     each sequence by itself, unpadded: exactly the real-token work, which is what packing
            (one row, block-diagonal attention, positions reset per sequence) would compute;
and prints each as a multiple of `alone`, next to the fraction of real tokens in the padded batch.

Lengths: prompts uniform in [--prompt-len], responses drawn so that about a third reach the
generation budget and the rest stop at EOS uniformly earlier, as in PPO on chat data.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as bench/generate.py; read when torch loads

import torch  # noqa: E402


def rlhf_lengths(batch: int, prompt: tuple[int, int], gen_len: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(prompt[0], prompt[1] + 1, (batch,), generator=g)
    r = torch.randint(8, gen_len + 1, (batch,), generator=g)
    full = torch.rand(batch, generator=g) < 1 / 3
    r = torch.where(full, torch.full_like(r, gen_len), r)
    return (p + r).tolist()


def _batch(lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask [B, L_max]."""
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def _run(model, batches: list[tuple[torch.Tensor, torch.Tensor | None]], backward: bool,
         unpad: bool = True) -> float:
    """CPU seconds of this process: with one thread, a steady measure of work on a shared machine."""
    from meshrl.model import transformer

    of = transformer.Unpad.of
    if not unpad:
        transformer.Unpad.of = staticmethod(lambda tokens: None)
    try:
        return _timed(model, batches, backward)
    finally:
        transformer.Unpad.of = of


def _timed(model, batches: list[tuple[torch.Tensor, torch.Tensor | None]], backward: bool) -> float:
    t0 = time.process_time()
    for ids, mask in batches:
        if backward:
            model.zero_grad(set_to_none=True)
            model(ids, mask).float().logsumexp(-1).mean().backward()
        else:
            with torch.no_grad():
                model(ids, mask)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--layers", type=int, default=4, help="override num_hidden_layers (0 = the preset's)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", default="32,128")
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from meshrl.model import build_model, get_preset, num_params

    cfg = get_preset(args.preset)
    if args.layers:
        cfg = cfg.replace(num_hidden_layers=args.layers)
    model = build_model(cfg, seed=0)
    lo, hi = map(int, args.prompt_len.split(","))
    lengths = rlhf_lengths(args.batch, (lo, hi), args.gen_len)
    ids, mask = _batch(lengths, cfg.vocab_size)
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sorted_batches = []
    size = -(-len(order) // args.buckets)
    for i in range(0, len(order), size):
        rows = order[i:i + size]
        w = max(lengths[r] for r in rows)
        sorted_batches.append((ids[rows, :w], mask[rows, :w]))
    alone = [(ids[i:i + 1, :n], None) for i, n in enumerate(lengths)]
    plans = {"masked": [(ids, mask)], "padded": [(ids, mask)], "sorted": sorted_batches, "alone": alone}

    _run(model, plans["padded"], args.backward)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in plans}
    for _ in range(args.repeats):
        for name, batches in plans.items():  # interleaved: noise hits all alike
            times[name].append(_run(model, batches, args.backward, unpad=name != "masked"))
    med = {k: statistics.median(v) for k, v in times.items()}
    real = sum(lengths)
    print(f"model: {args.preset} with {cfg.num_hidden_layers} layers ({num_params(cfg) / 1e6:.1f}M params); "
          f"{'forward+backward' if args.backward else 'forward'}; {torch.get_num_threads()} threads; "
          f"medians of {args.repeats}, CPU time")
    print(f"batch {args.batch}: lengths {min(lengths)}..{max(lengths)} (mean {real / len(lengths):.0f}); "
          f"real tokens {real} of {len(lengths) * max(lengths)} padded = {real / ids.numel():.0%}")
    sorted_tokens = sum(b[0].numel() for b in sorted_batches)
    for name, t in med.items():
        extra = f", {real / sorted_tokens:.0%} real tokens" if name == "sorted" else ""
        print(f"  {name:7s} {t * 1e3:8.0f} ms  = {t / med['alone']:.2f}x alone{extra}")


if __name__ == "__main__":
    main()
