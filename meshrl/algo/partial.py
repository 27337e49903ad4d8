"""Partial (interruptible) rollouts: one segment of a batch's generation under one policy version
(the schedule is meshrl/plan/stream.py; the runtime runs it, meshrl/runtime/stream.py).

The rows of a batch in flight live in a ``Batch`` (the generation call's output keys plus the
stream's own), P = prompt_len, N = gen_len:

    input_ids, attention_mask [b, P+N]   prompt, then the response so far (pads after it)
    response_mask [b, N]                 1 on the tokens generated so far
    logp_old [b, N]                      each token's log-prob under the version that sampled it
    token_version [b, N] long            the version that sampled each token (0 on padding)
    gen_live [b] long                    1 while the row has not ended (EOS or N tokens)
    gen_bound [b] long                   1 if the row was still in flight at its batch's bound

A segment continues each live row under the current weights: prompt + tokens so far are
re-prefilled (the KV cache of the old weights is not reused: the new weights' own numbers), and the
sampling noise continues at the row's decode step (``GenerationConfig.first_step``), so a row that
is continued under unchanged weights draws the very tokens of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses

import torch

from ..model.numerics import wide_dtype
from .batch import Batch
from .common import CallContext
from .rollout import generation_config

STREAM_KEYS = ("token_version", "gen_live", "gen_bound")


def admitted(part: Batch, gen_len: int, pad_id: int, dtype: torch.dtype) -> Batch:
    """The state of rows just admitted (nothing generated yet) from their prompts: prompt_ids,
    prompt_mask [b, P] (left-padded) -> the keys above, every row live."""
    b = len(part)
    p_ids, p_mask = part["prompt_ids"], part["prompt_mask"]
    zeros = torch.zeros(b, gen_len, dtype=torch.long)
    return Batch({"input_ids": torch.cat([p_ids, torch.full((b, gen_len), pad_id, dtype=torch.long)], 1),
                  "attention_mask": torch.cat([p_mask, zeros], 1), "response_mask": zeros.clone(),
                  "logp_old": torch.zeros(b, gen_len, dtype=dtype), "token_version": zeros.clone(),
                  "gen_live": torch.ones(b, dtype=torch.long), "gen_bound": torch.zeros(b, dtype=torch.long)},
                 part.index)


def contexts(state: Batch, rows: torch.Tensor, first: int) -> list[list[int]]:
    """What rows ``rows`` re-prefill: their real prompt tokens, then their first ``first`` response
    tokens (a live row has generated one token at every step so far)."""
    n = state["response_mask"].shape[1]
    p = state["input_ids"].shape[1] - n
    out = []
    for i in rows.tolist():
        prompt = state["input_ids"][i, :p][state["attention_mask"][i, :p].bool()]
        out.append(prompt.tolist() + state["input_ids"][i, p:p + first].tolist())
    return out


def continue_rows(h, part: Batch, state: Batch | None, ctx: CallContext, micro_batches: int, first: int,
                  budget: int, version: int, at_bound: bool, greedy: bool = False) -> Batch:
    """One segment: rows of ``part`` (prompt_ids, prompt_mask [b, P], sample_seed [b]) with their
    state so far (None: admitted now, ``first`` = 0) decoded ``budget`` more steps from decode step
    ``first`` under ``h``'s weights, version ``version``. ``at_bound``: the finish of a batch whose
    rows were interrupted before (rows still live are then marked ``gen_bound``). Every rank of the
    generation replica runs it and gets the same state (the engine's outputs are the replica's)."""
    cfg, tok = ctx.cfg, ctx.tokenizer
    n = cfg.data.gen_len
    if state is None:
        state = admitted(part, n, tok.pad_token_id, wide_dtype(torch.float32))
    live = state["gen_live"].bool()
    rows = live.nonzero().squeeze(1)
    if budget <= 0 or len(rows) == 0:
        return state
    data = {k: v.clone() for k, v in state.data.items()}
    if at_bound:
        data["gen_bound"][rows] = 1
    gcfg = dataclasses.replace(generation_config(cfg, tok, greedy), max_new_tokens=budget, first_step=first)
    seeds = None if greedy else part["sample_seed"][rows].tolist()
    out = h.generate(contexts(state, rows, first), gcfg, seeds, micro_batches)
    # the rows' state is host data, as every call's output batch (the engine's outputs are on its device)
    resp, lp, mask = out.responses.cpu(), out.response_logprobs.cpu(), out.response_mask.cpu().long()
    w = resp.shape[1]
    p = data["input_ids"].shape[1] - n
    cols = slice(first, first + w)
    data["input_ids"][rows, p + first:p + first + w] = resp
    data["attention_mask"][rows, p + first:p + first + w] = mask
    data["response_mask"][rows, cols] = mask
    data["logp_old"] = data["logp_old"].to(wide_dtype(lp.dtype))
    data["logp_old"][rows, cols] = lp * mask
    data["token_version"][rows, cols] = version * mask
    ended = mask.sum(1) < budget  # stopped at EOS before the segment's last step
    if gcfg.eos_token_id is not None and w == budget:
        ended |= (resp[:, -1] == gcfg.eos_token_id) & (mask[:, -1] == 1)
    data["gen_live"][rows] = (~ended & torch.tensor(first + budget < n)).long()
    return Batch(data, state.index)


def staleness(version: torch.Tensor, mask: torch.Tensor, bound: torch.Tensor | None, consumer: int
              ) -> dict[str, float]:
    """rollout/staleness_mean, rollout/staleness_max over the response tokens (staleness = the
    consuming version minus the version that sampled the token), rollout/interrupted (the share of
    sequences whose tokens came from more than one version) and rollout/at_bound (the share still in
    flight at their batch's bound, finished there) of token_version, response_mask [B, N], gen_bound [B]."""
    m = mask.bool()
    lag = (consumer - version)[m].double()
    spread = torch.where(m, version, version.max() + 1).amin(1) != torch.where(m, version, -1).amax(1)
    spread &= m.any(1)
    rows = max(1, len(mask))
    return {"rollout/staleness_mean": float(lag.mean()) if lag.numel() else 0.0,
            "rollout/staleness_max": float(lag.max()) if lag.numel() else 0.0,
            "rollout/interrupted": float(spread.sum()) / rows,
            "rollout/at_bound": float(bound.sum()) / rows if bound is not None else 0.0}
