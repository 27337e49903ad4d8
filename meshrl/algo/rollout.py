"""Pure helpers of the rollout calls (meshrl/algo/calls.py runs the calls themselves).

The token layout of every RL batch is in batch.py (P = prompt_len, N = gen_len).
"""

from __future__ import annotations

import torch

from ..config import Config
from ..model.generation import GenerationConfig
from .batch import Batch
from ..data.chat import end_of_turn_id
from ..model.numerics import wide_dtype


def generation_config(cfg: Config, tok, greedy: bool = False) -> GenerationConfig:
    """The run's sampling settings (or greedy decoding) for gen_len new tokens, stopping at EOS, or
    at the chat template's end-of-turn token under data.chat_template. Nothing of the weights is
    kept between calls (GenerationConfig.keep_weights): they change every step."""
    return GenerationConfig(max_new_tokens=cfg.data.gen_len, greedy=greedy, temperature=cfg.gen.temperature,
                            top_k=cfg.gen.top_k, top_p=cfg.gen.top_p, eos_token_id=stop_token_id(cfg, tok),
                            pad_token_id=tok.pad_token_id, compile=True if cfg.gen.compile is True else None,
                            keep_weights=False)


def stop_token_id(cfg: Config, tok) -> int | None:
    """The token that ends a response: the chat template's end of turn (data.chat_template), else EOS."""
    if cfg.data.chat_template and cfg.models.actor.path:
        return end_of_turn_id(cfg.models.actor.path, tok)
    return tok.eos_token_id


def pack_generation(out, p_ids: torch.Tensor, p_mask: torch.Tensor, n: int, pad: int) -> dict[str, torch.Tensor]:
    """GenerationOutput + prompts [b, P] -> input_ids, attention_mask [b, P+n], response_mask,
    logp_old [b, n]. Padded to the run's fixed n so batches from any call or rank concatenate."""
    b = p_ids.shape[0]
    resp = torch.full((b, n), pad, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.long)
    logp = torch.zeros(b, n, dtype=wide_dtype(out.response_logprobs.dtype))
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
