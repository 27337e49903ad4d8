"""Generation and inference calls: batch in, batch out, no gradients.

Data contracts (keys read -> keys written; shapes as in batch.py, P = prompt_len, N = gen_len).
Every call here is row-wise, so a runtime may split its batch across DP ranks by tokens
(``Batch.split``) and merge the outputs back (``Batch.merge``) without changing any value.

    generate       prompt_ids, prompt_mask [B, P], sample_seed [B]
                   -> input_ids, attention_mask [B, P+N], response_mask [B, N], logp_old [B, N]
    score          input_ids, attention_mask, response_mask, answer_ids [B, N] -> scores [B]
    ref_logprobs   input_ids, attention_mask, response_mask -> logp_ref [B, N]
    values         input_ids, attention_mask, response_mask -> values [B, N]
"""

from __future__ import annotations

import torch

from ..model.generation import GenerationConfig, generate
from .advantages import last_token_index
from .batch import Batch
from .common import CallContext, Role
from .losses import response_logits, token_logprobs
from .rewards import get_rule


@torch.no_grad()
def generate_call(role: Role, batch: Batch, ctx: CallContext, greedy: bool = False) -> Batch:
    """Sample (or greedily decode) one response per row; row i draws from sample_seed[i] only."""
    cfg, tok = ctx.cfg, ctx.tokenizer
    p_ids, p_mask = batch["prompt_ids"], batch["prompt_mask"]
    prompts = [row[m.bool()].tolist() for row, m in zip(p_ids, p_mask, strict=True)]
    gcfg = GenerationConfig(max_new_tokens=cfg.data.gen_len, greedy=greedy, temperature=cfg.gen.temperature,
                            top_k=cfg.gen.top_k, top_p=cfg.gen.top_p, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
    role.model.eval()
    out = generate(role.model, prompts, gcfg, seeds=None if greedy else batch["sample_seed"].tolist())
    return Batch(pack_generation(out, p_ids, p_mask, cfg.data.gen_len, tok.pad_token_id))


def pack_generation(out, p_ids: torch.Tensor, p_mask: torch.Tensor, n: int, pad: int) -> dict[str, torch.Tensor]:
    """GenerationOutput + prompts [b, P] -> input_ids, attention_mask [b, P+n], response_mask,
    logp_old [b, n]. Padded to the run's fixed n so batches from any call or rank concatenate."""
    b = p_ids.shape[0]
    resp = torch.full((b, n), pad, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.long)
    logp = torch.zeros(b, n, dtype=torch.float32)
    w = out.responses.shape[1]
    resp[:, :w], mask[:, :w], logp[:, :w] = out.responses, out.response_mask, out.response_logprobs
    return {"input_ids": torch.cat([p_ids, resp], 1), "attention_mask": torch.cat([p_mask, mask], 1),
            "response_mask": mask, "logp_old": logp * mask}


def decode_responses(batch: Batch, tok) -> list[str]:
    """The response text of each row (tokens under response_mask; EOS and pads dropped)."""
    p = batch["input_ids"].shape[1] - batch["response_mask"].shape[1]
    resp = batch["input_ids"][:, p:]
    return [tok.decode([t for t, m in zip(r.tolist(), rm.tolist(), strict=True) if m and t != tok.eos_token_id])
            for r, rm in zip(resp, batch["response_mask"], strict=True)]


@torch.no_grad()
def score_call(role: Role, batch: Batch, ctx: CallContext) -> Batch:
    """Sequence scores [B]: the reward model's value at the last real token, or the rule's verdict
    on the decoded response against the decoded answer."""
    if role.model is None:
        rule = get_rule(ctx.cfg.reward.rule)
        tok = ctx.tokenizer
        answers = [tok.decode(a.tolist()) for a in batch["answer_ids"]]
        scores = [rule(r, a) for r, a in zip(decode_responses(batch, tok), answers, strict=True)]
        return Batch({"scores": torch.tensor(scores, dtype=torch.float32)})
    role.model.eval()
    return Batch({"scores": sequence_reward(role.model, batch)})


def trim(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Drop the columns that are padding in every row (left of the longest prompt, right of the
    longest response), so compute follows real tokens, not the run's fixed P + N.

    Returns (input_ids, attention_mask) [B, p' + n'], p' (prompt columns kept) and n' (response
    columns kept). Pad keys are masked, so trimming changes no real token's output."""
    ids, attn, rmask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    p = ids.shape[1] - rmask.shape[1]
    prompt_cols = attn[:, :p].bool().any(0).nonzero()
    first = int(prompt_cols[0]) if len(prompt_cols) else p - 1
    resp_cols = rmask.bool().any(0).nonzero()
    n_keep = int(resp_cols[-1]) + 1 if len(resp_cols) else 1
    return ids[:, first:p + n_keep], attn[:, first:p + n_keep], p - first, n_keep


def _pad_to(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, n'] -> [B, n] with zeros on the right."""
    return torch.nn.functional.pad(x, (0, n - x.shape[1]))


def sequence_reward(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """A reward model's score of each sequence: its output at the last real token, [B] float32."""
    ids, attn, p, _ = trim(batch)
    values = model(ids, attn).float()  # [B, p' + n']
    last = p + last_token_index(batch["response_mask"])
    return values.gather(1, last[:, None]).squeeze(1)


@torch.no_grad()
def ref_logprobs_call(role: Role, batch: Batch, ctx: CallContext) -> Batch:
    """Reference log-probs of the response tokens, 0 on padding: logp_ref [B, N]."""
    role.model.eval()
    return Batch({"logp_ref": response_logprobs(role.model, batch)})


def response_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log p(response token t | prefix) under ``model``, [B, N] float32, masked to 0 on padding.
    Differentiable when called with grad enabled (the train calls use it)."""
    ids, attn, p, n = trim(batch)
    logits = response_logits(model(ids, attn), p)
    return _pad_to(token_logprobs(logits, ids[:, p:]), batch["response_mask"].shape[1]) * batch["response_mask"]


def response_values(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The critic's V(state before response token t), [B, N] float32, masked to 0 on padding."""
    ids, attn, p, n = trim(batch)
    values = model(ids, attn)[:, p - 1:-1].float()
    return _pad_to(values, batch["response_mask"].shape[1]) * batch["response_mask"]


@torch.no_grad()
def values_call(role: Role, batch: Batch, ctx: CallContext) -> Batch:
    role.model.eval()
    return Batch({"values": response_values(role.model, batch)})
