"""Generation under any layout: prefill and each decode step run through the pipeline stages, the
last stage gathers the (one position of) vocabulary-sharded logits over tp, samples with the very
same functions as meshrl/model/generation.py, and broadcasts the new tokens to every stage.

Each stage keeps a static KV cache for its own layers and its own (tensor-parallel share of the) KV
heads. Because sampling reuses ``generation.pick_token`` on the full float32 logits with per-row
counter-based noise, a row draws the same tokens as on one process; greedy decoding is argmax
either way. Compaction drops the same finished rows on every stage (all see the same tokens).

With pp > 1 the batch is split into micro-batches (``micro_batches``, default pp) that are in
flight at once, each stage working on a different one (generate_micro.py); ``micro_batches=1``
keeps the plain loop, where the whole batch passes the stages in turn (1 / pp of the ranks busy).
"""

from __future__ import annotations

import functools

import torch

from ..errors import UserError
from ..model.compiled_layers import prefill_layer
from ..model.decode_weights import head_call, make_caches
from ..model.generation import (GenerationConfig, GenerationOutput, bind_decode_pick, compact_caches, compiled,
                                decode_and_pick, decode_loop, cache_length, pick_token, seed_keys)
from ..model.prompt_batch import PromptBatch
from .generate_micro import micro_decode
from .groups import Axis
from .pipeline import Pipe
from .stage import Stage
from .tensor import gather_vocab
from ..model.numerics import wide, wide_dtype


def _stage_forward(stage: Stage, x: torch.Tensor, mask: torch.Tensor, caches: list,
                   start: int | torch.Tensor) -> torch.Tensor:
    return stage(x, mask, caches, start)


def _stage_prefill(stage: Stage, x: torch.Tensor, mask: torch.Tensor, caches: list,
                   start: int | torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """A prefill pass: the last stage computes only the last position's output (all its head
    reads); ``compiled``: the layers through compiled_layers.prefill_layer (dynamic shapes)."""
    return stage(x, mask, caches, start, layer_fn=prefill_layer if compiled else None,
                 last_only=stage.head is not None)


def _step(stage: Stage, pipe: Pipe, tp: Axis, x: torch.Tensor, mask: torch.Tensor, caches: list,
          start: int | torch.Tensor, forward=_stage_forward) -> torch.Tensor | None:
    """One pass of x [B, s] (token ids; the other stages receive hidden [B, s, hidden]) through the
    pipeline; -> full float32 logits [B, V] of the last position on the last stage, else None."""
    b, s = x.shape
    if not pipe.first:
        x = pipe.recv_forward((b, s, stage.model.cfg.hidden_size), stage.dtype)
    h = forward(stage, x, mask, caches, start)
    if not pipe.last:
        pipe.send_forward(h)
        return None
    return wide(gather_vocab(head_call(stage, caches)(h[:, -1]), tp))


@torch.inference_mode()
def pipelined_generate(stage: Stage, pipe: Pipe, tp: Axis, prompts: list[list[int]], cfg: GenerationConfig,
                       seeds: list[int] | None = None, micro_batches: int | None = None) -> GenerationOutput:
    """Same contract as ``meshrl.model.generation.generate``; every rank of the replica calls it
    with the same prompts (and ``micro_batches``) and gets the same output. ``micro_batches``:
    micro-batches in flight when pp > 1 (None: pp; 1: the stages take turns on the whole batch)."""
    cfg.validate()
    m = pipe.axis.size if micro_batches is None else micro_batches
    if m < 1:
        raise UserError(f"generate: micro_batches must be >= 1, got {m}")
    if not cfg.greedy and seeds is None:
        raise UserError("generate: sampling on several ranks needs per-row seeds (randomness belongs "
                        "to the data, so every rank and every layout draws the same tokens)")
    dev = stage.device
    keys = None if cfg.greedy else seed_keys(seeds, len(prompts), dev)
    micro = pipe.axis.size > 1 and m > 1 and len(prompts) > 1
    # a repeated prompt or shared prefix prefilled once, but not across micro-batches (caches of their own)
    batch = PromptBatch.of(prompts, cfg.pad_token_id, dev, share=not micro,
                           sliding_window=stage.model.cfg.sliding_window)
    # The stage's layers are compiled where they hold no collective (tp = 1); sends, receives and
    # tensor-parallel all-reduces stay eager.
    static = cfg.use_compile and tp.size == 1
    fwd = compiled("stage_forward", _stage_forward, stage) if static else _stage_forward
    pre = functools.partial(_stage_prefill, compiled=static)
    cache_len = cache_length(batch.ids.shape[1] + cfg.max_new_tokens, static)
    if micro:
        return micro_decode(pipe, lambda x, mask, caches, start: _step(stage, pipe, tp, x, mask, caches, start, pre),
                            lambda x, mask, caches, start: _step(stage, pipe, tp, x, mask, caches, start, fwd),
                            lambda b: make_caches(stage, b, cache_len, pack=not static, keep=cfg.keep_weights),
                            batch.ids, batch.mask, keys, cfg, m, static, wide_dtype(stage.dtype))
    caches = make_caches(stage, batch.cache_rows, cache_len, pack=not static, rows=len(prompts),
                         keep=cfg.keep_weights)

    def pick(logits: torch.Tensor | None, rows: torch.Tensor, step: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        row_keys = None if keys is None else keys[rows]
        if pipe.axis.size == 1:  # one stage: it has the logits (gathered over tp) and picks alone
            return pick_token(logits, row_keys, step, cfg.temperature, cfg.top_k, cfg.top_p)
        # The last stage picks; every stage gets the tokens (exact in float64) and their log-probs.
        packed = torch.empty(2, rows.numel(), dtype=torch.float64, device=dev)
        if pipe.last:
            tok, lp = pick_token(logits, row_keys, step, cfg.temperature, cfg.top_k, cfg.top_p)
            packed[0], packed[1] = tok.double(), lp.double()
        pipe.broadcast_from_last(packed)
        return packed[0].long(), packed[1].to(wide_dtype(stage.dtype))

    # One stage, no tp: the decode step, the LM head and the pick are one compiled graph, as in
    # model.generate, so the stage path pays no eager head, pick and float64 packing a step
    # (docs/model.md "The compiled decode step picks its token").
    both = compiled("decode_and_pick", decode_and_pick, stage) if static and pipe.axis.size == 1 else None
    out = decode_loop(lambda x, mask, start: _step(stage, pipe, tp, x, mask, caches, start, pre),
                      lambda tok, mask, slot: _step(stage, pipe, tp, tok[:, None], mask, caches, slot, fwd),
                      pick, lambda keep: compact_caches(caches, keep), batch, cfg, static=static,
                      decode_pick=None if both is None else bind_decode_pick(both, stage, caches, keys, cfg))
    pipe.wait_sends()
    return out
