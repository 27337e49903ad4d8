"""A decoder layer's attention: the rotary embedding applied (``rope_tables``, ``apply_rope``), the
CPU's own attention kernels (``decode_attention`` for a decode step, ``short_attention`` for short
bf16 sequences) and the ``Attention`` module that picks between them and SDPA, reading and writing
the layer's KV cache (batch_layout.KVCache) during generation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .batch_layout import KVCache, Unpad, last_position
from .config import ModelConfig
from .norm import RMSNorm
from .. import cpu_features
from . import worst_case
from .numerics import cast, wide_dtype


def native_bf16() -> bool:
    """cpu_features.native_bf16, which torch.compile takes as a constant (``compile_constants``)."""
    return cpu_features.native_bf16()


def compile_constants() -> None:
    """Before torch.compile traces these layers: ``native_bf16`` is a constant to dynamo (it reads
    /proc/cpuinfo, which dynamo cannot trace: a graph break in every bf16 layer). Marked here, not at
    import: torch.compiler imports dynamo, which then keeps the default process group alive past
    its destruction (tests/runtime/test_launch.py)."""
    torch.compiler.assume_constant_result(native_bf16)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, S, D] (rope.rope_cos_sin) -> what every layer's ``apply_rope`` reads, made once
    a forward: cos [B, 1, S, D] and the signed sine [B, 1, S, D], -sin on the first half of D."""
    half = sin.shape[-1] // 2
    return cos[:, None], torch.cat((-sin[..., :half], sin[..., half:]), -1)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D]; cos, signed_sin [B, 1, S, D] (``rope_tables``). HF's x * cos +
    rotate_half(x) * sin, where rotate_half(x) = (-x2, x1): the halves swapped by one roll, the sign
    carried by the table (the same bits: (-a) * b = a * (-b)), three kernels fewer a call."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A CPU decode step's attention: q [B, Hkv, g, D] (the g query heads of each KV head), k, v
    [B, Hkv, T, D], mask [B, 1, 1, T] boolean (True = attend) -> [B, Hkv, g, D].
    Two batched matmuls and a softmax: for a step's one query a row, SDPA's CPU flash kernel (built
    for long query blocks) costs about twice as much (docs/model.md "Decode attention"). Every
    (row, head) is its own small matmul, so a row gets the same bits in any batch."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
    return torch.matmul(_softmax(torch.where(mask, scores, float("-inf"))), v)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys in float32 at least, cast back to the scores' dtype (as HF's eager
    attention: bf16 scores, float32 probabilities, bf16 into the value matmul)."""
    return cast(scores.softmax(-1, dtype=wide_dtype(scores.dtype)), scores.dtype)


def short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    causal: bool) -> torch.Tensor:
    """Attention as two matmuls and a softmax, the score matrix materialised: q [B, Hq, S, D], k,
    v [B, Hkv, T, D] (each KV head serves Hq/Hkv query heads), mask [B, 1, S, T] boolean (True =
    attend) or None: then ``causal`` (query i sees keys 0..i, S = T) or every key. -> [B, Hq, S, D].
    bf16 attention over short sequences on a CPU with bf16 dot products (cpu_features.short_attention),
    where SDPA's flash kernel, built for long ones, is the slower; numerically HF's eager attention
    (scores in the inputs' dtype, softmax in float32). The mask is applied by torch.where, which
    keeps the one mask every layer shares for the backward, not a copy per layer."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is None and causal:
        s, t = scores.shape[-2:]
        mask = torch.ones(s, t, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))
    probs = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    del scores  # before the cast: per (query, key) the float32 probabilities and their cast at most
    return torch.matmul(probs.to(q.dtype), v)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.q_size, bias=bias)
        self.k_proj = nn.Linear(h, cfg.kv_size, bias=bias)
        self.v_proj = nn.Linear(h, cfg.kv_size, bias=bias)
        self.o_proj = nn.Linear(cfg.q_size, h, bias=False)
        if cfg.qk_norm:  # Qwen3: one RMSNorm over head_dim, shared by all heads, before the rotation
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def _rotated_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None,
                     unpad: Unpad | None, last: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, Hq, S', D] (S' = 1 with ``last``), k, v [B, Hkv, S, D], q and k rotated (see forward)."""
        sizes = [self.q_proj.weight.shape[0], self.k_proj.weight.shape[0], self.v_proj.weight.shape[0]]
        packed = None if cache is None else cache.packed
        if packed is not None:
            qkv = packed.qkv(x)
        elif cache is not None and cache.qkv is not None:  # one matmul for three (decode_weights.fused_weights)
            qkv = F.linear(x, *cache.qkv)
        else:
            qkv = None
        if qkv is not None and unpad is None and not self.qk_norm:
            return self._joint_rope(qkv, cos, sin, sizes[0] // self.head_dim, last)
        if qkv is not None:
            q, k, v = qkv.split(sizes, -1)
            q = last_position(q, unpad) if last else q
        else:
            q = self.q_proj(last_position(x, unpad) if last else x)
            k, v = self.k_proj(x), self.v_proj(x)
        if unpad is not None:  # projections on real tokens only; attention in the padded layout
            q = q if last else unpad.unpack(q)  # a last position is in the padded layout already
            k, v = unpad.unpack(k), unpad.unpack(v)
        b, s = k.shape[:2]
        q_len = 1 if last else s
        q = q.view(b, q_len, -1, self.head_dim)  # [B, S, Hq, D]
        k = k.view(b, s, -1, self.head_dim)  # [B, S, Hkv, D]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, S, D]
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)
        q_cos, q_sin = (cos, sin) if q_len == s else (cos[:, :, -q_len:], sin[:, :, -q_len:])
        return apply_rope(q, q_cos, q_sin), apply_rope(k, cos, sin), v

    def _joint_rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, last: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fused projections' output qkv [B, S, (Hq + 2 Hkv) D] -> q, k, v as ``_rotated_qkv``:
        the q and k heads, adjacent in qkv, rotated by one ``apply_rope`` over both (the same bits as
        one each: every element's formula is unchanged), four kernels fewer a layer."""
        b, s = qkv.shape[:2]
        heads = qkv.view(b, s, -1, self.head_dim)  # [B, S, Hq + 2 Hkv, D]
        kv_heads = (heads.shape[2] - q_heads) // 2
        qk = apply_rope(heads[:, :, :q_heads + kv_heads], cos.transpose(1, 2), sin.transpose(1, 2))
        q = qk[:, -1:, :q_heads] if last else qk[:, :, :q_heads]
        return q.transpose(1, 2), qk[:, :, q_heads:].transpose(1, 2), heads[:, :, q_heads + kv_heads:].transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                cache: KVCache | None = None, start: int = 0, unpad: Unpad | None = None,
                last: bool = False) -> torch.Tensor:
        """x [B, S, hidden], or its real tokens [1, N, hidden] with ``unpad`` (then so is the
        output); mask [B, 1, S, T] boolean (True = attend), T = start + S; or None for plain causal
        attention over S = T keys (then SDPA takes its is_causal path). ``last``: keys and values
        of every position (and the cache filled with them), the output of position S-1 only,
        [B, 1, hidden] (a prefill's last layer: no other position's output is ever read)."""
        packed = None if cache is None else cache.packed  # decode_weights.PackedLayer: oneDNN-ordered copies
        q, k, v = self._rotated_qkv(x, cos, sin, cache, unpad, last)
        b, q_len = k.shape[0], q.shape[2]
        if cache is not None:
            k, v = cache.update(start, k, v)
        if last and mask is not None:
            mask = mask[:, :, -1:]
        # Grouped-query attention: each KV head serves Hq/Hkv query heads. SDPA's enable_gqa does
        # this without materialising repeated K/V (a full copy of the cache at every decode step,
        # a large share of a CPU decode step: docs/model.md "Generation").
        gqa = q.shape[1] != k.shape[1]
        # a CPU's own attention kernels below: float32 / float64, and bf16 where the CPU has bf16
        # dot products (meshrl/cpu_features.py); elsewhere SDPA
        own = worst_case.device_type(q) == "cpu" and (q.dtype in (torch.float32, torch.float64) or (
            q.dtype == torch.bfloat16 and native_bf16()))
        if q_len == 1 and mask is not None and (gqa or own):
            # A decode step: the g query heads of a KV head become g queries of one head, so the
            # kernel loops over B x Hkv heads instead of B x Hq; on a CPU it is decode_attention,
            # elsewhere SDPA (docs/model.md "Decode attention").
            # out [B, Hkv, g, D] is [B, Hq, 1, D] in memory.
            grouped = q.reshape(b, k.shape[1], -1, self.head_dim)
            if own and cache is not None:
                k, v, mask = cache.decode_keys(k, v, mask)
            out = (decode_attention(grouped, k, v, mask) if own
                   else F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask)).reshape(b, 1, -1)
        elif own and q.dtype == torch.bfloat16 and cpu_features.short_keys(k.shape[2]):
            # (cpu_features.short_attention: ``own`` holds bf16 only where the CPU has bf16 dot products)
            # The last query alone sees every key (not causal); docs/model.md "Short attention".
            out = short_attention(q, k, v, mask, causal=not last).transpose(1, 2).reshape(b, q_len, -1)
        else:
            dtype = q.dtype
            if worst_case.device_type(q) == "cpu" and dtype in (torch.bfloat16, torch.float16):
                # CPU flash attention's low-precision backward is several times slower than its
                # float32 one, so it runs in float32 (docs/model.md "bf16 on a CPU").
                q, k, v = q.float(), k.float(), v.float()
            # The last query alone sees every key: no mask, and not SDPA's top-left causal alignment.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and not last,
                                                 enable_gqa=gqa)
            out = out.to(dtype).transpose(1, 2).reshape(b, q_len, -1)
        return (self.o_proj if packed is None else packed.o)(out if unpad is None or last else unpad.pack(out))
