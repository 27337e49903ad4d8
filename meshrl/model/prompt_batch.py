"""A batch's prompts as the prefill runs them: left-padded, each distinct prompt once (a GRPO
group's samples share one), and the prefix every prompt shares (a chat template's system turn)
prefilled once for one row (``PromptBatch``; docs/model.md "What the prompts share is prefilled once")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError
from . import worst_case


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


def distinct_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], list[int] | None]:
    """(each distinct prompt once, in first-seen order; for each row, its prompt's index among them),
    or (prompts, None) when no two rows share a prompt. GRPO-style groups sample n responses to one
    prompt: the prompt's forward pass is the same for all n, so the prefill runs it once and the
    caches' row is repeated (``decode_loop``'s ``repeat``) -- vLLM's prefix caching does this for a
    whole shared prompt too. Not under a dry run, whose worst case prefills every row."""
    index: dict[tuple[int, ...], int] = {}
    repeat = [index.setdefault(tuple(p), len(index)) for p in prompts]
    if len(index) == len(prompts) or worst_case.active():
        return prompts, None
    return [list(p) for p in index], repeat


# The shortest prefix worth a pass of its own: shorter ones (the demo's "7+5=" prompts share a byte
# or two) save less than the extra pass costs.
SHARED_PREFIX_MIN = 16


def shared_prefix(prompts: list[list[int]], sliding_window: int | None = None) -> int:
    """Tokens that every prompt starts with (a chat template's system prompt), leaving each at least
    one of its own; 0 below SHARED_PREFIX_MIN, for fewer than two prompts, under a dry run (its
    worst case prefills every token of every row), and for a sliding-window model (whose mask counts
    slots: the pads that ``PromptBatch`` puts after the prefix would take places in the window)."""
    if len(prompts) < 2 or sliding_window is not None or worst_case.active():
        return 0
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return n if n >= SHARED_PREFIX_MIN else 0


@dataclass
class PromptBatch:
    """A batch's prompts as its prefill runs them. ids, mask [u, P] (1 = real token) hold each distinct
    prompt once (``repeat``: the row of each of the batch's rows, None: a row each, as given). Their
    first ``shared`` slots hold the prefix all of them share, the rest each prompt's remainder,
    left-padded: the prefix is prefilled once, for one row, whose caches then serve every row, and
    the remainders after it (vLLM's prefix caching does as much). Positions count real tokens only,
    so the pads between prefix and remainder change no row's positions; the last prompt token of
    every row sits in slot P-1, as with plain left padding, and P is the longest prompt's length."""

    ids: torch.Tensor
    mask: torch.Tensor
    shared: int = 0
    repeat: list[int] | None = None

    @classmethod
    def of(cls, prompts: list[list[int]], pad_id: int, device: torch.device, share: bool = True,
           sliding_window: int | None = None) -> "PromptBatch":
        """``share``: prefill a repeated prompt and a shared prefix once (False: every row in full)."""
        distinct, repeat = distinct_prompts(prompts) if share else (prompts, None)
        n = shared_prefix(distinct, sliding_window) if share else 0
        ids, mask = left_pad([p[n:] for p in distinct] if n else distinct, pad_id, device)
        if n:
            head = torch.tensor(distinct[0][:n], dtype=torch.long, device=device).expand(len(distinct), n)
            ids, mask = torch.cat([head, ids], 1), torch.cat([torch.ones_like(head), mask], 1)
        return cls(ids, mask, n, repeat)

    @property
    def cache_rows(self) -> int:
        """Rows the caches start with: one for a shared prefix, else a row per distinct prompt."""
        return 1 if self.shared else self.ids.shape[0]
