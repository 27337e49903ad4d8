"""Generation under any layout: prefill and each decode step run through the pipeline stages, the
last stage gathers the (one position of) vocabulary-sharded logits over tp, samples with the very
same functions as meshrl/model/generation.py, and broadcasts the new tokens to every stage.

Each stage keeps a KV cache for its own layers and its own (tensor-parallel share of the) KV
heads. Because sampling reuses ``generation.sample`` on the full float32 logits with per-row
generators, a row draws the same tokens as on one process; greedy decoding is argmax either way.
"""

from __future__ import annotations

import torch

from ..errors import UserError
from ..model.generation import GenerationConfig, GenerationOutput, _generators, left_pad, make_caches, sample
from .groups import Axis
from .pipeline import Pipe
from .stage import Stage
from .tensor import gather_vocab


def _step(stage: Stage, pipe: Pipe, tp: Axis, x: torch.Tensor, mask: torch.Tensor, caches: list,
          start: int) -> torch.Tensor | None:
    """One pass of x [B, s] (token ids; the other stages receive hidden [B, s, hidden]) through the
    pipeline; -> full float32 logits [B, V] of the last position on the last stage, else None."""
    b, s = x.shape
    if not pipe.first:
        x = pipe.recv_forward((b, s, stage.model.cfg.hidden_size), stage.dtype)
    h = stage(x, mask, caches, start)
    if not pipe.last:
        pipe.send_forward(h)
        return None
    return gather_vocab(stage.head(h[:, -1]), tp).float()


@torch.inference_mode()
def pipelined_generate(stage: Stage, pipe: Pipe, tp: Axis, prompts: list[list[int]], cfg: GenerationConfig,
                       seeds: list[int] | None = None) -> GenerationOutput:
    """Same contract as ``meshrl.model.generation.generate``; every rank of the replica calls it
    with the same prompts and gets the same output."""
    cfg.validate()
    if not cfg.greedy and seeds is None:
        raise UserError("generate: sampling on several ranks needs per-row seeds (randomness belongs "
                        "to the data, so every rank and every layout draws the same tokens)")
    b = len(prompts)
    dev = stage.device
    gens = None if cfg.greedy else _generators(seeds, b, dev)
    ids, prompt_mask = left_pad(prompts, cfg.pad_token_id, dev)
    p = ids.shape[1]
    caches = make_caches(stage, b, p + cfg.max_new_tokens)
    mask = torch.cat([prompt_mask, torch.ones(b, cfg.max_new_tokens, dtype=torch.long, device=dev)], 1)
    tokens, logprobs, alive_cols = [], [], []
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    logits = _step(stage, pipe, tp, ids, prompt_mask, caches, 0)
    for step in range(cfg.max_new_tokens):
        packed = torch.empty(2, b, dtype=torch.float64, device=dev)  # token ids are exact in float64
        if pipe.last:
            tok = sample(logits, cfg, gens)
            packed[0] = tok.double()
            packed[1] = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1).double()
        pipe.broadcast_from_last(packed)
        tok, lp = packed[0].long(), packed[1].float()
        tok = torch.where(alive, tok, torch.full_like(tok, cfg.pad_token_id))
        tokens.append(tok)
        logprobs.append(torch.where(alive, lp, torch.zeros_like(lp)))
        alive_cols.append(alive.long())
        if cfg.eos_token_id is not None:
            alive = alive & (tok != cfg.eos_token_id)
        if step + 1 == cfg.max_new_tokens or not bool(alive.any()):
            break
        logits = _step(stage, pipe, tp, tok[:, None], mask[:, :p + step + 1], caches, p + step)
    pipe.wait_sends()
    return GenerationOutput(torch.stack(tokens, 1), torch.stack(logprobs, 1).float(), torch.stack(alive_cols, 1))
