"""``Batch``: per-sequence data passed between calls, as a dict of tensors with a leading sequence dim.

Every RL batch in meshrl uses one token layout, so that any call can read any other call's output:

    input_ids      [B, P + N]  left-padded prompt (P columns) followed by the right-padded response
    attention_mask [B, P + N]  1 = real token
    response_mask  [B, N]      1 = a real response token (the tokens a policy loss is taken over)

P and N are fixed per run (``data.prompt_len`` and ``data.gen_len``), so batches from different
data-parallel ranks concatenate without re-padding. Per-token tensors over the response (log-probs,
values, advantages) are [B, N]; per-sequence ones (scores) are [B].

Splitting across data-parallel ranks balances the *token* count (the work of a call grows with
tokens, not sequences), and ``Batch.merge`` restores the original order, so the split a plan
chooses never changes which sequence is which.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..errors import UserError


@dataclass
class Batch:
    """Named tensors sharing dim 0 (sequences). ``index`` holds each row's position in the batch
    it was split from (None for an unsplit batch)."""

    data: dict[str, torch.Tensor] = field(default_factory=dict)
    index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.data.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch tensors disagree on the sequence dim: {sizes}")

    def __len__(self) -> int:
        return next(iter(self.data.values())).shape[0] if self.data else 0

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self.data[key]
        except KeyError:
            raise KeyError(f"batch has no key {key!r}; it has {sorted(self.data)}") from None

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def keys(self) -> list[str]:
        return list(self.data)

    def with_(self, **tensors: torch.Tensor) -> Batch:
        """A new batch with these keys added or replaced (the input batch is left untouched)."""
        return Batch({**self.data, **tensors}, self.index)

    def only(self, keys: tuple[str, ...] | list[str]) -> Batch:
        """The sub-batch of these keys: what a call declares it reads (missing keys are an error)."""
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise KeyError(f"batch lacks keys {missing}; it has {sorted(self.data)}")
        return Batch({k: self.data[k] for k in keys}, self.index)

    def select(self, rows: torch.Tensor) -> Batch:
        """Rows ``rows`` (long [k]) of every tensor; ``index`` records where they came from."""
        base = self.index if self.index is not None else torch.arange(len(self))
        return Batch({k: v[rows] for k, v in self.data.items()}, base[rows])

    def tokens(self) -> torch.Tensor:
        """Real tokens per sequence, long [B] (from ``attention_mask``, else every row counts 1)."""
        if "attention_mask" in self.data:
            return self.data["attention_mask"].sum(-1).long()
        return torch.ones(len(self), dtype=torch.long)

    def split(self, n: int) -> list[Batch]:
        """Split into ``n`` parts with token counts as equal as a greedy packing gets them.

        Longest sequences first, each to the part with the fewest tokens so far (ties: fewer
        sequences, then lower part id), so the split is deterministic. Rows keep their relative
        order inside a part. Needs n <= len(self) so that no rank gets an empty batch."""
        if n < 1 or n > len(self):
            raise UserError(f"cannot split a batch of {len(self)} sequences into {n} parts")
        tok = self.tokens().tolist()
        order = sorted(range(len(tok)), key=lambda i: (-tok[i], i))
        loads = [(0, 0, p) for p in range(n)]  # (tokens, sequences, part id)
        members: list[list[int]] = [[] for _ in range(n)]
        for i in order:
            j = min(range(n), key=lambda p: loads[p])
            members[j].append(i)
            loads[j] = (loads[j][0] + tok[i], loads[j][1] + 1, j)
        # Guarantee every part is non-empty (greedy by tokens can leave one empty if n is close
        # to len(self) and a few sequences dominate): move the shortest row from the fullest part.
        for j in range(n):
            if not members[j]:
                donor = max(range(n), key=lambda p: len(members[p]))
                members[j].append(members[donor].pop(-1))
        return [self.select(torch.tensor(sorted(m), dtype=torch.long)) for m in members]

    def chunks(self, n: int) -> list[Batch]:
        """``n`` contiguous, nearly equal parts by sequence count (micro-batches of one rank)."""
        if n < 1 or n > len(self):
            raise UserError(f"cannot cut a batch of {len(self)} sequences into {n} micro-batches")
        return [self.select(r) for r in torch.arange(len(self)).tensor_split(n)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    @staticmethod
    def merge(parts: list[Batch]) -> Batch:
        """Inverse of ``split``/``chunks``: concatenate and put rows back at their ``index``."""
        if not parts:
            raise ValueError("nothing to merge")
        keys = parts[0].keys()
        for p in parts:
            if p.keys() != keys:
                raise ValueError(f"parts disagree on keys: {keys} vs {p.keys()}")
        if any(p.index is None for p in parts):
            raise ValueError("merge needs parts made by split/chunks/select (they carry an index)")
        index = torch.cat([p.index for p in parts])
        order = torch.argsort(index)
        data = {k: torch.cat([p.data[k] for p in parts])[order] for k in keys}
        return Batch(data, None)

    @staticmethod
    def cat(parts: list[Batch]) -> Batch:
        """Stack batches one after another (e.g. the sampled and the greedy responses of ReMax)."""
        keys = parts[0].keys()
        return Batch({k: torch.cat([p.data[k] for p in parts]) for k in keys}, None)
