"""Batched generation with a static KV cache, as small functions in the style of gpt-fast.

    prompts --left-pad--> prefill --> sample --> decode one token --> sample --> ... until EOS/budget

Prompts of different lengths are left-padded, so that every row's next token sits in the same
column; positions are counted over real tokens only (``positions_from_mask``), as HF's
``generate`` does, so a row's logits do not depend on how much padding it got.

Randomness belongs to the data, not to the batch: row i draws only from its own generator seeded
by ``seeds[i]``, one draw per step, so a row samples the same tokens in any batch and at any batch
position. Returned log-probabilities are those of the raw model distribution (log_softmax of the
untempered, unfiltered float32 logits), so that PPO's "old" log-probs equal a fresh forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import UserError
from .transformer import CausalLM, KVCache


@dataclass
class GenerationConfig:
    max_new_tokens: int = 32
    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    eos_token_id: int | None = None
    pad_token_id: int = 0

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise UserError(f"temperature must be > 0 for sampling, got {self.temperature} "
                            "(use greedy for argmax decoding)")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class GenerationOutput:
    responses: torch.Tensor  # [B, N] long, N <= max_new_tokens; pad_token_id after EOS/end
    response_logprobs: torch.Tensor  # [B, N] float32, log-prob under the raw model distribution
    response_mask: torch.Tensor  # [B, N] long, 1 for generated tokens (EOS included), 0 after


# ---- the steps ----------------------------------------------------------------------------------
def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """prompts -> input_ids [B, P], attention_mask [B, P] (1 = real token), padded on the left."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("generate: every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def make_caches(model: CausalLM, batch: int, max_len: int) -> list[KVCache]:
    """One static cache per local layer, sized for the heads this module actually holds."""
    layers = model.model.layers
    attn = layers[0].self_attn
    w = attn.k_proj.weight
    kv_heads = w.shape[0] // attn.head_dim
    return [KVCache(batch, kv_heads, max_len, attn.head_dim, w.dtype, w.device) for _ in layers]


def decode_one(model: CausalLM, tok: torch.Tensor, mask: torch.Tensor, caches: list[KVCache],
               start: int) -> torch.Tensor:
    """tok [B] at cache slot ``start``; mask [B, start+1] covers the cached prefix. -> logits [B, V]."""
    hidden = model.model(tok[:, None], mask, caches, start)
    return model.lm_head(hidden[:, -1]).float()


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [B, V] -> the same with tokens outside top-k / the top-p nucleus set to -inf.
    Top-p keeps the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, cfg: GenerationConfig, gens: list[torch.Generator] | None) -> torch.Tensor:
    """logits [B, V] float32 -> tokens [B]. Sampling uses the exponential race (argmax of p / E with
    E ~ Exp(1), as gpt-fast does), each row drawing its E from its own generator."""
    if cfg.greedy:
        return logits.argmax(-1)
    probs = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
    race = torch.stack([torch.empty_like(probs[i]).exponential_(1.0, generator=g)
                        for i, g in enumerate(gens)])
    return (probs / race).argmax(-1)


# ---- the loop ----------------------------------------------------------------------------------
def _generators(seeds: list[int] | None, n: int, device: torch.device) -> list[torch.Generator] | None:
    if seeds is None:
        seeds = [int(s) for s in torch.randint(0, 2**62, (n,))]
    if len(seeds) != n:
        raise UserError(f"generate: got {len(seeds)} seeds for {n} prompts")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def pick_token(logits: torch.Tensor, cfg: GenerationConfig, gens: list[torch.Generator] | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] float32 -> (tokens [B] long, their log-prob [B] float32 under the raw logits)."""
    tok = sample(logits, cfg, gens)
    return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)


def decode_loop(forward: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor | None],
                pick: Callable[[torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]],
                ids: torch.Tensor, prompt_mask: torch.Tensor, cfg: GenerationConfig) -> GenerationOutput:
    """The decoding loop every generator shares (one process here, a pipeline in
    meshrl/parallel/generate.py): prefill, then pick a token and decode it, until EOS or the budget.

    ``forward(x [B, s], mask [B, start+s], start)`` runs x at cache slots start.. and returns the
    next-token float32 logits [B, V] (None on ranks that hold none); ``pick(logits)`` returns
    (tokens [B] long, log-probs [B] float32), the same on every rank that calls it."""
    b, p = ids.shape
    # The mask for the whole run; generated columns switch on as they are filled.
    mask = torch.cat([prompt_mask, torch.ones(b, cfg.max_new_tokens, dtype=torch.long, device=ids.device)], 1)
    tokens, logprobs, alive_cols = [], [], []
    alive = torch.ones(b, dtype=torch.bool, device=ids.device)
    logits = forward(ids, prompt_mask, 0)
    for step in range(cfg.max_new_tokens):
        tok, lp = pick(logits)
        tok = torch.where(alive, tok, torch.full_like(tok, cfg.pad_token_id))
        tokens.append(tok)
        logprobs.append(torch.where(alive, lp, torch.zeros_like(lp)))
        alive_cols.append(alive.long())
        if cfg.eos_token_id is not None:
            alive = alive & (tok != cfg.eos_token_id)
        if step + 1 == cfg.max_new_tokens or not bool(alive.any()):
            break
        logits = forward(tok[:, None], mask[:, :p + step + 1], p + step)
    return GenerationOutput(torch.stack(tokens, 1), torch.stack(logprobs, 1).float(),
                            torch.stack(alive_cols, 1))


@torch.inference_mode()
def generate(model: CausalLM, prompts: list[list[int]], cfg: GenerationConfig,
             seeds: list[int] | None = None) -> GenerationOutput:
    """Generate up to ``cfg.max_new_tokens`` tokens after each prompt (lists of token ids).

    Stops early once every row has produced EOS. See GenerationOutput for the shapes."""
    cfg.validate()
    device = model.lm_head.weight.device
    gens = None if cfg.greedy else _generators(seeds, len(prompts), device)
    ids, prompt_mask = left_pad(prompts, cfg.pad_token_id, device)
    caches = make_caches(model, len(prompts), ids.shape[1] + cfg.max_new_tokens)

    def forward(x: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
        # Only the last position goes through the LM head (the others' logits are never used).
        return model.lm_head(model.model(x, mask, caches, start)[:, -1]).float()

    return decode_loop(forward, lambda logits: pick_token(logits, cfg, gens), ids, prompt_mask, cfg)


def sequence_logprobs(model: CausalLM, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """input_ids, attention_mask [B, T] -> [B, T-1] float32: log p(token t+1 | tokens <= t).
    Differentiable (use it for PPO's new log-probs); values at pad positions are meaningless."""
    logits = model(input_ids, attention_mask)[:, :-1].float()
    target = input_ids[:, 1:]
    picked = logits.gather(-1, target[..., None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
