"""Pipelined decoding with micro-batches in flight: every stage works on a different micro-batch.

The batch is split into ``m`` micro-batches (contiguous rows, sizes differing by at most one), each
with its own KV caches and its own decoding state. Every stage runs the same list of passes in the
same order: the prefill of micro-batches 0..m-1, then round after round the decoding step of each
micro-batch still running::

    stage 0:   P0 P1 | D0 D1 | D0 D1 | ...        Pj: prefill of j, Dj: one decoding step of j
    stage 1:      P0 P1 | D0 D1 | D0 D1 | ...     (m = pp = 2: stage s at tick t works on (t - s) mod m)

After its pass of micro-batch j the last stage picks j's tokens (``generation.pick_token``: the
same per-row counter-based noise as one process, so the same tokens) and sends them with their
log-probs to every other stage (non-blocking point-to-point sends, one small [2, b] float64 message
per stage). A stage other than the last receives j's tokens right before its next pass of j (stage
0 embeds them). Between two passes of j a stage runs the other m - 1 micro-batches, while j's
pass travels the other pp - 1 stages and its tokens come back: with m = pp a round takes one
micro-batch's trip (pp stage steps and the messages' latencies), every stage computing all but
those latencies; more micro-batches hide the latencies too, at the price of more passes (each
reads the stage's weights and pays its per-call cost). Every stage applies the tokens with the
same bookkeeping as ``decode_loop`` (record, end-of-sequence, host check every ``sync_every``
steps, compaction of the micro-batch), so all of them agree, without another message, on which
micro-batches still run and which rows they hold; a finished micro-batch stops costing at once.

No deadlock: every message a stage waits for (a hidden state from the stage before, the tokens of
an earlier pass from the last) was sent by a pass that comes earlier in the one order all stages
follow, sends never wait, and every receive has the pipe's deadline. The streams are FIFO per
(sender, receiver, tag) and sent and received in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model.generation import (GenerationConfig, GenerationOutput, compact_caches, compaction_keep,
                                loop_buffers, pick_token)
from .pipeline import Pipe
from ..model import worst_case

# pass_fn(x [b, s], mask, caches, start) -> float32 logits [b, V] of the last position on the last
# stage, None elsewhere (it receives and sends the hidden states of the pass)
PassFn = Callable[[torch.Tensor, torch.Tensor, list, "int | torch.Tensor"], "torch.Tensor | None"]


@dataclass
class _Micro:
    """One micro-batch's decoding state (the same on every stage, but for ``logits``)."""

    rows: torch.Tensor  # [b] original index of each row still in the micro-batch
    ids: torch.Tensor  # [b, P] the left-padded prompts (prefill)
    mask: torch.Tensor  # [b, P+N (bucketed when static)] the mask of the whole run
    caches: list
    alive: torch.Tensor  # [b] bool
    tok: torch.Tensor | None = None  # [b] the last tokens picked: the next pass's input
    logits: torch.Tensor | None = None  # [b, V] on the last stage: what the next pick reads
    done: bool = False


def split_rows(b: int, m: int, device: torch.device) -> list[torch.Tensor]:
    """Rows 0..b-1 in min(m, b) contiguous micro-batches, sizes differing by at most one."""
    return list(torch.tensor_split(torch.arange(b, device=device), min(m, b)))


def micro_decode(pipe: Pipe, prefill: PassFn, decode: PassFn, make_caches: Callable[[int], list],
                 ids: torch.Tensor, prompt_mask: torch.Tensor, keys: torch.Tensor | None,
                 cfg: GenerationConfig, m: int, static: bool = False, lp_dtype: torch.dtype = torch.float32
                 ) -> GenerationOutput:
    """``decode_loop``'s contract and result, with ``m`` micro-batches in flight through the pipe.
    ``make_caches(b)`` makes a micro-batch's static caches (``cache_length(P + N, static)`` slots);
    ``keys`` [B] (None = greedy); ``static``: decode gets the whole mask and a tensor slot (the
    compiled step; the slots a bucketed cache has beyond P + N stay masked); ``lp_dtype``: the
    log-probs' dtype (model/numerics.py: float64 for a float64 model)."""
    b, p = ids.shape
    n, dev = cfg.max_new_tokens, ids.device
    mask, out_tok, out_lp, out_alive, slot, every = loop_buffers(prompt_mask, cfg, static)
    out_lp = out_lp.to(lp_dtype)
    mbs = [_Micro(r, ids[r], mask[r], make_caches(len(r)), torch.ones(len(r), dtype=torch.bool, device=dev))
           for r in split_rows(b, m, dev)]

    def pick(mb: _Micro, step: int) -> None:
        """Step ``step``'s tokens of ``mb``: picked on the last stage, received elsewhere."""
        packed = torch.empty(2, len(mb.rows), dtype=torch.float64, device=dev)
        if pipe.last:
            tok, lp = pick_token(mb.logits, None if keys is None else keys[mb.rows],
                                 torch.tensor(step + cfg.first_step, dtype=torch.long, device=dev),
                                 cfg.temperature, cfg.top_k, cfg.top_p)
            packed[0], packed[1] = tok.double(), lp.double()  # token ids are exact in float64
            mb.logits = None
            pipe.send_to_stages(packed)
        else:
            pipe.recv_from_last(packed)
        _apply(mb, packed[0].long(), packed[1].to(lp_dtype), step)

    def _apply(mb: _Micro, tok: torch.Tensor, lp: torch.Tensor, step: int) -> None:
        # decode_loop's bookkeeping, for one micro-batch
        tok = torch.where(mb.alive, tok, cfg.pad_token_id)
        out_tok[mb.rows, step] = tok
        out_lp[mb.rows, step] = torch.where(mb.alive, lp, 0.0)
        out_alive[mb.rows, step] = mb.alive.long()
        if cfg.eos_token_id is not None:
            mb.alive = mb.alive & (tok != cfg.eos_token_id)
        mb.tok = tok
        if step + 1 == n:
            mb.done = True
        elif cfg.eos_token_id is not None and (step + 1) % every == 0 and not worst_case.active():
            live = int(mb.alive.sum())  # the host check
            if live == 0:
                mb.done = True
            elif live <= cfg.compact_below * len(mb.rows):
                keep = compaction_keep(mb.alive, static)
                compact_caches(mb.caches, keep)
                mb.rows, mb.alive, mb.tok, mb.mask = mb.rows[keep], mb.alive[keep], mb.tok[keep], mb.mask[keep]

    # A dry run's worst case makes every micro-batch's decoding passes alike (full-length rows, the
    # first micro-batch the largest): those of the first two run and stand for the others'. Every
    # micro-batch is prefilled (its caches filled, its hidden state sent on and held until the send
    # completes, as in the run), and its first tokens are received; every stage and tp rank skips
    # the same passes (model/worst_case.py repeated_steps).
    alike = worst_case.repeated_steps(len(mbs))
    for mb in mbs:  # the prefills, one micro-batch after another down the pipe
        mb.logits = prefill(mb.ids, mb.mask[:, :p], mb.caches, 0)
        if pipe.last:
            pick(mb, 0)
    for step in worst_case.decode_steps(n, 1):
        for j, mb in enumerate(mbs):
            if mb.done:
                continue
            if not pipe.last:
                pick(mb, step - 1)  # the tokens of this micro-batch's previous pass
                if mb.done:
                    continue
            if j not in alike:  # a dry run's stand-in: the first two micro-batches decode for it
                mb.done = True
                continue
            x = mb.tok[:, None]
            if static:
                mb.logits = decode(x, mb.mask, mb.caches, slot + step - 1)
            else:
                mb.logits = decode(x, mb.mask[:, :p + step], mb.caches, p + step - 1)
            if pipe.last:
                pick(mb, step)
    for mb in mbs:  # the other stages still owe the receive of each running micro-batch's last tokens
        if not mb.done:
            pick(mb, n - 1)
    pipe.wait_sends()
    # as decode_loop: up to the last row's end (the worst case: the whole budget)
    width = n if worst_case.active() else max(int(out_alive.sum(1).max()), 1)
    return GenerationOutput(out_tok[:, :width].clone(), out_lp[:, :width].clone(), out_alive[:, :width].clone())
