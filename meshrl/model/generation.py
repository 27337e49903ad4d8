"""Batched generation with static KV caches, as small functions in the style of gpt-fast.

    prompts --left-pad--> prefill --> pick --> decode one token --> pick --> ... until EOS/budget

Prompts of different lengths are left-padded, so that every row's next token sits in the same
column; positions are counted over real tokens only (``positions_from_mask``), as HF's
``generate`` does, so a row's logits do not depend on how much padding it got.

Under ``GenerationConfig.compile`` the decode step has the same shapes at every step: the caches
are static [B, kvh, P+N, D], the mask covers all P+N slots from the start (causality hides the
slots not yet written), and the slot is a 0-dim tensor, so ``torch.compile`` traces it once.
Eager steps read only the filled prefix of the same caches (fewer keys on a CPU). Nothing waits
for the host per token: end-of-sequence is tracked on the device and looked at every
``sync_every`` steps. At those checks, once at most ``compact_below`` of the batch is alive, the
finished rows are dropped from the batch and the caches (compaction), so a long tail does not
pay for the whole batch.

Randomness belongs to the data, not to the batch: row i's noise is a hash of (seeds[i], step,
token) (meshrl/model/sampling.py), so a row samples the same tokens in any batch, at any batch
position, after compaction and under any plan. Returned log-probabilities are those of the raw
model distribution (log_softmax of the untempered, unfiltered float32 logits), so that PPO's "old"
log-probs equal a fresh forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
import os
from dataclasses import dataclass

import torch

from ..errors import UserError
from .compiled_layers import before_compile, prefill_layer
from .sampling import filter_logits, row_keys, sample_tokens
from .batch_layout import KVCache
from .decode_weights import head_call, make_caches
from .prompt_batch import PromptBatch
from . import worst_case
from .transformer import CausalLM
from .numerics import wide

__all__ = ["GenerationConfig", "GenerationOutput", "generate", "sequence_logprobs", "filter_logits", "PromptBatch"]


@dataclass
class GenerationConfig:
    max_new_tokens: int = 32
    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    eos_token_id: int | None = None
    pad_token_id: int = 0
    # Run the decode step through torch.compile (same tokens, faster steps). Left at None, the
    # environment decides: MESHRL_GEN_COMPILE=1 turns it on in this process and the ranks it starts
    # (that runs the generation tests under compile without a copy of each test).
    compile: bool | None = None  # None: MESHRL_GEN_COMPILE
    # Decode steps between host checks for "every row has ended" (and compaction). None: 1 on a CPU,
    # where the check reads memory the host already has (the demo's ~3-token answers would otherwise
    # decode 8 steps; measured: actor_gen 2.3x slower), 8 on an accelerator, where it is a sync.
    sync_every: int | None = None
    compact_below: float = 0.5  # at a check, drop finished rows once at most this share is alive
    # The sampling step of the first new token: a row continued after ``first_step`` tokens of its
    # response (a partial rollout re-prefilled with new weights, meshrl/algo/partial.py) draws the
    # noise of the steps it is at, as if it had not been interrupted.
    first_step: int = 0
    # Keep the copies of the weights a call decodes with (packed or fused: decode_weights.py) with the
    # model, for the next call to reuse while the weights are unchanged (decode_copies): an eval loop
    # or a CLI's batches pack once, one copy of the weights held between calls. The RL runtime's
    # rollouts (algo/rollout.generation_config), whose weights change every step, hold none.
    keep_weights: bool = True

    @property
    def use_compile(self) -> bool:
        return self.compile if self.compile is not None else os.environ.get("MESHRL_GEN_COMPILE", "") == "1"

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
        if self.sync_every is not None and self.sync_every < 1:
            raise UserError(f"sync_every must be >= 1, got {self.sync_every}")
        if self.first_step < 0:
            raise UserError(f"first_step must be >= 0, got {self.first_step}")
        if not 0.0 <= self.compact_below < 1.0:
            raise UserError(f"compact_below must be in [0, 1) (0 = never compact), got {self.compact_below}")


@dataclass
class GenerationOutput:
    responses: torch.Tensor  # [B, N] long, N <= max_new_tokens; pad_token_id after EOS/end
    response_logprobs: torch.Tensor  # [B, N] float32, log-prob under the raw model distribution
    response_mask: torch.Tensor  # [B, N] long, 1 for generated tokens (EOS included), 0 after


# ---- the steps ----------------------------------------------------------------------------------
def compact_caches(caches: list[KVCache], keep: torch.Tensor) -> None:
    """Keep rows ``keep`` [b'] (long) of every cache (an index may repeat: ``decode_loop``'s ``repeat``)."""
    for c in caches:
        c.k, c.v = c.k.index_select(0, keep), c.v.index_select(0, keep)


def decode_one(model: CausalLM, tok: torch.Tensor, mask: torch.Tensor, caches: list[KVCache],
               start: torch.Tensor | int) -> torch.Tensor:
    """tok [B] written at cache slot ``start``; mask [B, start+1] covers the filled cache, or, with
    ``start`` a 0-dim long tensor, mask [B, max_len] covers the whole cache: then the shapes are the
    same at every step (one compiled graph). -> next-token logits [B, V] float32 (float64 for a
    float64 model: model/numerics.py)."""
    hidden = model.model(tok[:, None], mask, caches, start)
    return wide(head_call(model, caches)(hidden[:, -1]))


def decode_and_pick(model, tok: torch.Tensor, mask: torch.Tensor, caches: list[KVCache], slot: torch.Tensor,
                    keys: torch.Tensor | None, step: torch.Tensor, temperature: float, top_k: int, top_p: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``decode_one`` then ``pick_token``: one function, so one compiled graph a token."""
    return pick_token(decode_one(model, tok, mask, caches, slot), keys, step, temperature, top_k, top_p)


def bind_decode_pick(fn: Callable, model, caches: list[KVCache], keys: torch.Tensor | None,
                     cfg: GenerationConfig) -> DecodePick:
    """``decode_loop``'s ``decode_pick`` from ``fn`` (``decode_and_pick``, compiled) and what stays
    fixed for one generation: the model, its caches, the rows' sampling keys, the sampling settings."""
    return lambda tok, mask, slot, rows, step: fn(model, tok, mask, caches, slot, None if keys is None else keys[rows],
                                                  step, cfg.temperature, cfg.top_k, cfg.top_p)


def pick_token(logits: torch.Tensor, keys: torch.Tensor | None, step: torch.Tensor, temperature: float,
               top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] float32 -> (tokens [B] long, their log-prob [B] float32 under the raw logits).
    ``keys`` None = greedy."""
    tok = sample_tokens(logits, keys, step, temperature, top_k, top_p)
    return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)


# Compiled decode steps are specialised to their shapes (dynamic=False): a graph with symbolic batch
# and cache sizes runs its steps about 2x slower on a CPU (docs/model.md). Shapes are kept to few
# values instead: the cache length is rounded up to a multiple of CACHE_BUCKET (unwritten slots are
# masked), compaction shrinks the batch to a power of two, so a run compiles a handful of graphs and
# then reuses them.
CACHE_BUCKET = 32


def compiled(name: str, fn: Callable, owner: torch.nn.Module) -> Callable:
    """``torch.compile(fn, dynamic=False)`` for one model (``owner``), made once and kept on it.
    On a CPU with inductor's C++ wrapper (less per step than the Python one: docs/model.md); on a GPU in
    "reduce-overhead" mode, i.e. replayed as CUDA graphs (each output is read before the next call,
    as CUDA graph replays require)."""
    cache = owner.__dict__.setdefault("_meshrl_compiled", {})
    if name not in cache:
        before_compile()
        param = next(owner.parameters(), None)
        if param is not None and param.device.type == "cuda":
            cache[name] = torch.compile(fn, dynamic=False, mode="reduce-overhead")
        else:
            cache[name] = torch.compile(fn, dynamic=False, options={"cpp_wrapper": True})
    return cache[name]


def cache_length(needed: int, static: bool) -> int:
    """KV-cache slots for prompts + new tokens: exact when eager, bucketed for a compiled step."""
    return -(-needed // CACHE_BUCKET) * CACHE_BUCKET if static else needed


def compaction_keep(alive: torch.Tensor, static: bool) -> torch.Tensor:
    """alive [b] bool -> rows to keep [b'] long: the live rows, and for a compiled step as many
    finished rows as round b' up to a power of two (the graph then sees few batch sizes)."""
    live = alive.nonzero().squeeze(1)
    if not static:
        return live
    want = 1 << max(int(live.numel()) - 1, 0).bit_length()
    if want >= alive.numel():
        return torch.arange(alive.numel(), device=alive.device)
    return torch.cat([live, (~alive).nonzero().squeeze(1)[:want - live.numel()]])


def seed_keys(seeds: list[int] | None, n: int, device: torch.device) -> torch.Tensor:
    """Per-row sampling keys [n] from the caller's seeds (random ones when None)."""
    if seeds is None:
        seeds = [int(s) for s in torch.randint(0, 2**62, (n,))]
    if len(seeds) != n:
        raise UserError(f"generate: got {len(seeds)} seeds for {n} prompts")
    return row_keys([int(s) for s in seeds], device)


# ---- the loop ----------------------------------------------------------------------------------
# prefill(ids [B, s], mask [B, start+s], start) (int start: the slot of ids' first token) and
# decode(tok [b], mask [b, P+N], slot 0-dim tensor) return the next-token float32 logits [b, V]
# (None on ranks that hold none). pick(logits, rows [b], step 0-dim tensor), rows being the original
# index of each row still in the batch, returns (tokens [b] long, log-probs [b] float32), the same on
# every rank that calls it. compact(keep [b'] long) keeps those rows of the caller's caches (an index
# may repeat).
Prefill = Callable[[torch.Tensor, torch.Tensor, int], "torch.Tensor | None"]
Decode = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], "torch.Tensor | None"]
Pick = Callable[["torch.Tensor | None", torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# decode_pick(tok [b], mask, slot, rows [b], step) -> pick's (tokens, log-probs) after decoding tok
DecodePick = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                      tuple[torch.Tensor, torch.Tensor]]


def loop_buffers(prompt_mask: torch.Tensor, cfg: GenerationConfig, static: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """What every decoding loop starts from, for prompt_mask [B, P] and N = cfg.max_new_tokens:
    (mask [B, P+N] (static: [B, cache_length(P+N)]), out_tok [B, N] long (pads), out_lp [B, N]
    float32, out_alive [B, N] long, the first decode slot P (0-dim long), steps between host checks)."""
    (b, p), n, dev = prompt_mask.shape, cfg.max_new_tokens, prompt_mask.device
    # The mask for the whole run, fixed: generated slots are real tokens; causality hides the future;
    # the slots a bucketed cache has beyond p + n are never written and stay masked.
    mask = torch.cat([prompt_mask, torch.ones(b, n, dtype=torch.long, device=dev)], 1)
    if static:
        mask = torch.nn.functional.pad(mask, (0, cache_length(p + n, True) - (p + n)))
    out_tok = torch.full((b, n), cfg.pad_token_id, dtype=torch.long, device=dev)
    out_lp = torch.zeros(b, n, dtype=torch.float32, device=dev)
    out_alive = torch.zeros(b, n, dtype=torch.long, device=dev)
    slot = torch.tensor(p, dtype=torch.long, device=dev)
    return mask, out_tok, out_lp, out_alive, slot, cfg.sync_every or (1 if dev.type == "cpu" else 8)


class _Record:
    """The tokens, log-probs and alive flags of the steps decoded since the batch last changed
    (rows [b] fixed), written into the outputs [B, N] in one go at a compaction and at the end:
    three scatters a segment instead of six small kernels a token (docs/model.md "Recording without
    per-token kernels"). A row's tokens after its EOS become pads there."""

    def __init__(self, out_tok: torch.Tensor, out_lp: torch.Tensor, out_alive: torch.Tensor, pad_id: int) -> None:
        self.out_tok, self.out_lp, self.out_alive, self.pad_id = out_tok, out_lp, out_alive, pad_id
        self.first, self.steps = 0, []

    def add(self, tok: torch.Tensor, lp: torch.Tensor, alive: torch.Tensor) -> None:
        self.steps.append((tok, lp, alive))

    def flush(self, rows: torch.Tensor) -> None:
        """Write the recorded steps of rows [b]; the next segment starts after them."""
        if not self.steps:
            return
        tok, lp, alive = (torch.stack(t, 1) for t in zip(*self.steps, strict=True))  # [b, steps]
        cols = slice(self.first, self.first + len(self.steps))
        self.out_tok[rows, cols] = torch.where(alive, tok, self.pad_id)
        self.out_lp[rows, cols] = torch.where(alive, lp, 0.0)
        self.out_alive[rows, cols] = alive.long()
        self.first, self.steps = cols.stop, []


def prefill_prompts(prefill: Prefill, compact: Callable[[torch.Tensor], None], batch: PromptBatch
                    ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Fill the caches with ``batch``'s prompts: the shared prefix for one row, then (its caches
    repeated for every distinct prompt) the remainders after it; then a row per row of the batch.
    -> (the last position's logits [B, V] or None, prompt mask [B, P])."""
    n, u = batch.shared, batch.ids.shape[0]
    if n:
        prefill(batch.ids[:1, :n], batch.mask[:1, :n], 0)  # its logits are never used
        compact(torch.zeros(u, dtype=torch.long, device=batch.ids.device))
    logits, mask = prefill(batch.ids[:, n:], batch.mask, n), batch.mask
    if batch.repeat is not None:
        rep = torch.tensor(batch.repeat, dtype=torch.long, device=batch.ids.device)
        compact(rep)
        logits = None if logits is None else logits.index_select(0, rep)
        mask = mask.index_select(0, rep)
    return logits, mask


def decode_loop(prefill: Prefill, decode: Decode, pick: Pick, compact: Callable[[torch.Tensor], None],
                prompts: PromptBatch, cfg: GenerationConfig, static: bool = False,
                decode_pick: DecodePick | None = None) -> GenerationOutput:
    """The decoding loop every generator shares (one process here, a pipeline in
    meshrl/parallel/generate.py): prefill, then pick a token and decode it, until EOS or the budget.

    ``static``: the decode step gets the whole mask and a tensor slot (fixed shapes, for a compiled
    step); otherwise an int slot and the mask of the filled prefix, so that eager attention reads
    only the filled cache (fewer keys, and the very numbers of an unpadded forward).
    ``decode_pick``: decode and pick in one call (one compiled graph: one guard check and one call
    a token instead of two), used for the decode steps instead of ``decode`` then ``pick``.
    The prefill fills the caches as ``prompts`` says (``prefill_prompts``); the output has a row per
    row of the batch.
    Host syncs: one every ``cfg.sync_every`` steps (all ended? compact?) and one at the end.
    A finished row keeps decoding its own (ignored) tokens until it is compacted away: rows do not
    interact, so what it feeds itself changes no other row."""
    n, dev = cfg.max_new_tokens, prompts.ids.device
    logits, prompt_mask = prefill_prompts(prefill, compact, prompts)
    b, p = prompt_mask.shape
    mask, out_tok, out_lp, out_alive, slot, every = loop_buffers(prompt_mask, cfg, static)
    rows = torch.arange(b, device=dev)  # original index of each row still in the batch
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    slots = slot + torch.arange(n, device=dev)  # the decode step's cache slot, a 0-dim tensor each
    steps = torch.arange(n, device=dev) + cfg.first_step  # the sampling noise's step, 0-dim each (no retrace)
    tok, lp = pick(logits, rows, steps[0])
    out_lp = out_lp.to(lp.dtype)  # float32, or float64 for a float64 model
    record = _Record(out_tok, out_lp, out_alive, cfg.pad_token_id)
    for step in worst_case.decode_steps(n):
        record.add(tok, lp, alive)
        if cfg.eos_token_id is not None:
            alive = alive & (tok != cfg.eos_token_id)
        if step + 1 == n:
            break
        if cfg.eos_token_id is not None and (step + 1) % every == 0 and not worst_case.active():
            live = int(alive.sum())  # the host check
            if live == 0:
                break
            if live <= cfg.compact_below * len(rows):
                record.flush(rows)
                keep = compaction_keep(alive, static)
                compact(keep)
                rows, alive, tok, mask = rows[keep], alive[keep], tok[keep], mask[keep]
        if decode_pick is not None:
            tok, lp = decode_pick(tok, mask, slots[step], rows, steps[step + 1])
        else:
            logits = decode(tok, mask, slots[step]) if static else decode(tok, mask[:, :p + step + 1], p + step)
            tok, lp = pick(logits, rows, steps[step + 1])
    record.flush(rows)
    # as if the loop had stopped when the last row ended (the worst case: the whole budget)
    width = n if worst_case.active() else max(int(out_alive.sum(1).max()), 1)
    return GenerationOutput(out_tok[:, :width].clone(), out_lp[:, :width].clone(), out_alive[:, :width].clone())


@torch.inference_mode()
def generate(model: CausalLM, prompts: list[list[int]], cfg: GenerationConfig,
             seeds: list[int] | None = None) -> GenerationOutput:
    """Generate up to ``cfg.max_new_tokens`` tokens after each prompt (lists of token ids).

    Stops early once every row has produced EOS. See GenerationOutput for the shapes."""
    cfg.validate()
    device = model.lm_head.weight.device
    keys = None if cfg.greedy else seed_keys(seeds, len(prompts), device)
    batch = PromptBatch.of(prompts, cfg.pad_token_id, device, sliding_window=model.config.sliding_window)
    caches = make_caches(model, batch.cache_rows, cache_length(batch.ids.shape[1] + cfg.max_new_tokens,
                                                               cfg.use_compile),
                         pack=not cfg.use_compile, rows=len(prompts), keep=cfg.keep_weights)
    both = compiled("decode_and_pick", decode_and_pick, model) if cfg.use_compile else None

    def prefill(x: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
        # Only the last position goes through the LM head (the others' logits are never used).
        h = model.model(x, mask, caches, start, layer_fn=prefill_layer if cfg.use_compile else None,
                        last_only=True)
        return wide(head_call(model, caches)(h[:, -1]))

    return decode_loop(prefill, lambda tok, mask, slot: decode_one(model, tok, mask, caches, slot),
                       lambda logits, rows, step: pick_token(logits, None if keys is None else keys[rows], step,
                                                             cfg.temperature, cfg.top_k, cfg.top_p),
                       lambda keep: compact_caches(caches, keep), batch, cfg, static=cfg.use_compile,
                       decode_pick=None if both is None else bind_decode_pick(both, model, caches, keys, cfg))


def sequence_logprobs(model: CausalLM, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """input_ids, attention_mask [B, T] -> [B, T-1] float32 (float64 for a float64 model): log p(token
    t+1 | tokens <= t).
    Differentiable (use it for PPO's new log-probs); values at pad positions are meaningless."""
    logits = wide(model(input_ids, attention_mask)[:, :-1])
    target = input_ids[:, 1:]
    picked = logits.gather(-1, target[..., None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
