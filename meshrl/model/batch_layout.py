"""How a padded batch and its KV cache are laid out: the padding-free packing of real tokens
(``Unpad``), the static per-layer KV cache (``KVCache``), and the masks and positions a padded
``attention_mask [B, S]`` (1 = real token) gives (causal plus key padding; positions counted over
real tokens, as HF's ``generate`` does)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import worst_case


@dataclass
class Unpad:
    """Padding-free execution of a padded batch [B, S]: ``idx`` [N] holds the flat positions of its
    N real tokens. The projections, MLPs and norms run on the packed [1, N, ...] tokens only, so
    pad tokens cost no matmul; attention alone goes back to the padded [B, S] layout, where each
    row's keys, mask and cache slots are where they always were (no block-diagonal mask, no varlen
    kernel: CPUs and gloo have none). Every real token gets the same numbers as padded execution,
    up to the matmul's blocking over a different number of rows."""

    idx: torch.Tensor
    b: int
    s: int

    @staticmethod
    def of(tokens: torch.Tensor) -> Unpad | None:
        """tokens [B, S] (1 = real) -> an Unpad, or None when there is no pad token (one host sync:
        nonzero's)."""
        if tokens.shape[1] < 2 or worst_case.active():  # a dry run: no pad token is removed
            return None
        idx = tokens.flatten().nonzero().squeeze(1)
        return None if len(idx) == tokens.numel() else Unpad(idx, tokens.shape[0], tokens.shape[1])

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """[B, S, *] -> [1, N, *]"""
        return t.flatten(0, 1).index_select(0, self.idx)[None]

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        """[1, N, *] -> [B, S, *], zeros at the pads."""
        flat = t.new_zeros(self.b * self.s, *t.shape[2:]).index_copy(0, self.idx, t[0])
        return flat.view(self.b, self.s, *t.shape[2:])

    def last(self, t: torch.Tensor) -> torch.Tensor:
        """[1, N, *] -> [B, 1, *]: each row's last position S-1 (zeros where it is a pad)."""
        want = torch.arange(self.b, device=t.device) * self.s + (self.s - 1)  # [B] flat positions
        at = torch.searchsorted(self.idx, want).clamp(max=self.idx.numel() - 1)  # idx is ascending
        hit = (self.idx[at] == want).view(-1, *([1] * (t.dim() - 2)))
        return torch.where(hit, t[0, at], 0)[:, None].to(t.dtype)


def last_position(x: torch.Tensor, unpad: Unpad | None) -> torch.Tensor:
    """x [B, S, *] (or its packed [1, N, *] with ``unpad``) -> [B, 1, *] at position S-1."""
    return x[:, -1:] if unpad is None else unpad.last(x)


class KVCache:
    """Static per-layer key/value buffers, gpt-fast style: k, v [B, kv_heads, max_len, head_dim].

    ``kv_heads`` is whatever the attention module holds locally (all, or a tensor-parallel shard).

    ``qkv`` ((weight [q+k+v, hidden], bias or None)) and ``gate_up`` ([2 x intermediate, hidden]):
    the layer's projections concatenated for the generation this cache lives through (the weights
    do not change during it), or None; see decode_weights.fused_weights. ``packed``: the layer's
    projections reordered for oneDNN's matmul for that generation (decode_weights.PackedLayer), or None;
    ``head``: the same for the LM head, on the last layer's cache of the stage that holds it.
    ``whole_reads``: an eager decode step may attend over the whole buffers, the unwritten slots
    masked (``reads_whole``), where a batched matmul copies a strided prefix (bf16 on a CPU:
    decode_weights.whole_cache_reads)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.gate_up: torch.Tensor | None = None
        self.packed = None  # decode_weights.PackedLayer
        self.head = None  # decode_weights.Packed
        self.whole_reads = False

    def update(self, start: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, kvh, s, D] at slots start..start+s; return the filled prefix, or, when
        ``start`` is a 0-dim tensor (the fixed-shape decode step), the whole buffers: the caller's
        mask then hides the slots not yet written, and the shapes never change between steps."""
        if isinstance(start, torch.Tensor):
            slots = start + torch.arange(k.shape[2], device=k.device)
            self.k.index_copy_(2, slots, k)
            self.v.index_copy_(2, slots, v)
            return self.k, self.v
        end = start + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]

    def reads_whole(self, filled: int) -> bool:
        """Whether a decode step with ``filled`` slots written reads the whole buffers instead of
        the filled prefix (``whole_reads``): where at least half the slots are written, since the
        prefix's copy costs about what the product over it does (docs/model.md "Whole-cache reads").
        The unwritten slots hold zeros: masked, they add exact zeros to the output."""
        return self.whole_reads and 2 * filled >= self.k.shape[2]

    def decode_keys(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A decode step's keys and values from ``update``'s filled prefix k, v [B, kvh, T, D] and
        its mask [B, 1, 1, T]: those, or, where ``reads_whole``, the whole buffers and the mask
        padded with False over the unwritten slots."""
        if not self.reads_whole(k.shape[2]):
            return k, v, mask
        return self.k, self.v, torch.nn.functional.pad(mask, (0, self.k.shape[2] - k.shape[2]))


def build_mask(key_mask: torch.Tensor, q_len: int, sliding_window: int | None = None,
               q_start: torch.Tensor | None = None) -> torch.Tensor:
    """key_mask [B, T] (1 = real token) -> boolean [B, 1, q_len, T] for the last q_len queries, or
    for the queries at slots q_start.. (a 0-dim tensor: the static-cache decode step).

    Causal plus key padding. Every query may also attend to itself, so that rows of pad queries
    are never fully masked (which would give NaN); pad outputs are ignored downstream."""
    t = key_mask.shape[1]
    first = t - q_len if q_start is None else q_start
    q_pos = (first + torch.arange(q_len, device=key_mask.device))[:, None]  # [S, 1]
    k_pos = torch.arange(t, device=key_mask.device)[None, :]  # [1, T]
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        allowed = allowed & (q_pos - k_pos < sliding_window)
    allowed = allowed[None] & key_mask.bool()[:, None, :]  # [B, S, T]
    allowed = allowed | (k_pos == q_pos)[None]
    return allowed[:, None]


def right_padded(key_mask: torch.Tensor | None) -> bool:
    """key_mask [B, T] (1 = real token; None = no padding) -> whether every row is real tokens
    followed only by pads (no pad before a real token), so plain causal attention at positions
    0..T-1 gives every real token what the padded mask gives it. One host sync on a GPU."""
    if key_mask is None or key_mask.shape[1] < 2:
        return True
    return bool((key_mask[:, 1:] <= key_mask[:, :-1]).all())


def positions_from_mask(key_mask: torch.Tensor) -> torch.Tensor:
    """key_mask [B, T] -> positions [B, T]: index among real tokens (pads get 0 or their run value)."""
    return (key_mask.long().cumsum(-1) - 1).clamp(min=0)
