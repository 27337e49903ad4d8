"""Decoder-only transformer of the LLaMA / Qwen2 / Mistral / Qwen3 / Qwen3-MoE / Mixtral families,
numerically matching HF.

Module and parameter names follow Hugging Face (``model.layers.i.self_attn.q_proj``) so that
checkpoints load without renaming, and so that torch's tensor-parallel styles apply to the plain
``nn.Linear`` projections: attention reshapes with ``view(b, s, -1, head_dim)``, so the same code
runs with the full set of heads or with a tensor-parallel shard of them.

Variable-length batches use *padding with masks*: ``attention_mask [B, S]`` (1 = real token, 0 =
pad) may pad on either side; positions are counted over real tokens only (as HF's ``generate``
does), so a left-padded prompt gets the same positions as the unpadded one; the packing, masks and
KV cache behind that live in batch_layout.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .batch_layout import KVCache, Unpad, build_mask, last_position, positions_from_mask, right_padded
from .config import ModelConfig
from .hf_save import DEFAULT_MAX_SHARD_BYTES, save_pretrained
from .moe import SparseMoE
from .rope import rope_cos_sin
from .. import cpu_features
from . import worst_case
from .numerics import cast, wide, wide_dtype


def native_bf16() -> bool:
    """cpu_features.native_bf16, which torch.compile takes as a constant (``compile_constants``)."""
    return cpu_features.native_bf16()


def compile_constants() -> None:
    """Before torch.compile traces these layers: ``native_bf16`` is a constant to dynamo (it reads
    /proc/cpuinfo, which dynamo cannot trace: a graph break in every bf16 layer). Marked here, not at
    import: torch.compiler imports dynamo, which then keeps the default process group alive past
    its destruction (tests/runtime/test_launch.py)."""
    torch.compiler.assume_constant_result(native_bf16)


class RMSNorm(nn.Module):
    """HF's LlamaRMSNorm: normalise in float32, cast back, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = wide(x)  # float32 (float64 stays float64)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * cast(x32, x.dtype)


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
            if own and cache is not None and cache.reads_whole(k.shape[2]):
                mask = F.pad(mask, (0, cache.k.shape[2] - k.shape[2]))  # the unwritten slots: False
                k, v = cache.k, cache.v
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


# MKL's float32 GEMM computes x @ W^T for 16..48 rows faster when asked for (W @ x^T)^T instead
# (the rows of a decode step at batch 16-48, W of MLP shapes); bit for bit the same at K = 256,
# within ~1e-4 relative at K >= 896, as F.linear's own rows differ between batch sizes. Used for
# gate_proj and up_proj only: their outputs go to one fused SwiGLU kernel, while the others feed
# reductions (RMSNorm) and attention that run slower on the transposed layout. The shapes measured
# and the gains: docs/model.md "Skinny matmuls".
SKINNY_ROWS = (16, 48)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """x [..., K], weight [N, K] -> x @ weight^T [..., N] computed as (weight @ x^T)^T where that is
    the faster orientation (float32 on a CPU, SKINNY_ROWS rows, no autograd); None elsewhere."""
    rows = x.numel() // x.shape[-1]
    lo, hi = SKINNY_ROWS
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled() or not lo <= rows <= hi:
        return None
    return torch.mm(weight, x.reshape(rows, -1).t()).t().reshape(*x.shape[:-1], -1)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor, gate_up: torch.Tensor | None = None, packed=None) -> torch.Tensor:
        """``gate_up``: gate_proj's and up_proj's weights concatenated (one matmul), or None;
        ``packed``: a generation's oneDNN-ordered copies (decode_weights.PackedLayer), or None."""
        if packed is not None:
            gate, up = packed.gate_up(x).chunk(2, -1)
            return packed.down(F.silu(gate) * up)
        if gate_up is None:
            gate = skinny_linear(x, self.gate_proj.weight)
            if gate is None:
                return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
            return self.down_proj(F.silu(gate) * skinny_linear(x, self.up_proj.weight))
        gate, up = F.linear(x, gate_up).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP. The MLP is dense (``mlp``) or a sparse MoE block, named as the
    family's checkpoints name it (Qwen3-MoE ``mlp``, Mixtral ``block_sparse_moe``); ``ffn`` is
    whichever it is."""

    def __init__(self, cfg: ModelConfig, index: int, experts: range | None = None) -> None:
        """``experts``: SparseMoE's (the experts a MoE layer holds; all by default)."""
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.moe = cfg.is_moe_layer(index)
        setattr(self, cfg.moe_prefix if self.moe else "mlp", SparseMoE(cfg, experts) if self.moe else MLP(cfg))
        self.ffn_name = cfg.moe_prefix if self.moe else "mlp"

    @property
    def ffn(self) -> nn.Module:
        return getattr(self, self.ffn_name)

    def forward(self, x, cos, sin, mask, cache: KVCache | None = None, start: int = 0,
                token_mask: torch.Tensor | None = None, unpad: Unpad | None = None,
                last: bool = False) -> torch.Tensor:
        """x [B, S, hidden] (or [1, N, hidden] with ``unpad``, see Unpad). token_mask [B, S]
        (1 = real token, padded layout): only a MoE block's balance loss reads it. ``last``: the
        output of position S-1 only, [B, 1, hidden] (see Attention; the cache gets every position)."""
        a = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, start, unpad, last)
        if last:
            x, unpad = last_position(x, unpad), None
            token_mask = None if token_mask is None else token_mask[:, -1:]
        x = x + a
        h = self.post_attention_layernorm(x)
        if not self.moe:
            return x + self.ffn(h, None if cache is None else cache.gate_up, None if cache is None else cache.packed)
        if unpad is None:
            return x + self.ffn(h, token_mask)
        # The balance loss is per row: the MoE block sees the padded [B, S] layout.
        return x + unpad.pack(self.ffn(unpad.unpack(h), token_mask))


def _call_layer(layer: DecoderLayer, *args) -> torch.Tensor:
    return layer(*args)


class Backbone(nn.Module):
    """HF's ``model.`` submodule: embeddings, decoder layers, final norm.

    ``embed_tokens`` or ``norm`` may be None for a pipeline stage that does not own them; then
    the input (or output) is the hidden state [B, S, hidden]."""

    def __init__(self, cfg: ModelConfig, layer_ids: range | None = None, experts: range | None = None) -> None:
        """``layer_ids``: the (global) layers to build, all by default (a pipeline stage: its own);
        ``experts``: the (global) experts each MoE layer holds, all by default (a tensor-parallel
        stage: its own, so that the others are never built)."""
        super().__init__()
        self.cfg = cfg
        self.embed_tokens: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        ids = range(cfg.num_hidden_layers) if layer_ids is None else layer_ids
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, experts) for i in ids)
        self.norm: RMSNorm | None = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                caches: list[KVCache] | None = None, start: int | torch.Tensor = 0,
                layer_fn: Callable[..., torch.Tensor] | None = None, last_only: bool = False) -> torch.Tensor:
        """x: input_ids [B, S] or hidden [B, S, hidden]. attention_mask [B, start+S] covers the
        cached prefix too. With ``start`` a 0-dim tensor (static caches: the decode step, whose
        shapes never change), attention_mask covers the whole cache [B, max_len] and the queries
        sit at slots start..start+S. ``layer_fn(layer, h, cos, sin, mask, cache, start, tokens,
        unpad, last)`` runs each layer (default: the layer itself; compiled_layers.prefill_layer
        compiles a prefill's). Returns hidden [B, S, hidden]; with ``last_only`` [B, 1, hidden], the
        last position's, the last layer computing no other position's output (a prefill: every
        layer still fills its cache; LLAMA_3M batch 32: -7% a prefill, docs/model.md)."""
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        b, s = h.shape[:2]
        unpad = None
        if isinstance(start, torch.Tensor):  # the static-cache decode step: gather at tensor slots
            slots = (start + torch.arange(s, device=h.device))[None].expand(b, s)
            pos = positions_from_mask(attention_mask).gather(1, slots)
            tokens = attention_mask.gather(1, slots)
            mask = build_mask(attention_mask, s, self.cfg.sliding_window, q_start=start)
        else:
            plain_causal = start == 0 and right_padded(attention_mask) and (
                self.cfg.sliding_window is None or s <= self.cfg.sliding_window)
            if attention_mask is None:
                attention_mask = torch.ones(b, start + s, dtype=torch.long, device=h.device)
            pos = positions_from_mask(attention_mask)[:, start:start + s]
            tokens = attention_mask[:, start:start + s]
            # Batches without left padding skip building the [B, 1, S, S] mask and take SDPA's
            # causal path (flash / memory-efficient kernels on a GPU; on par or slightly faster on
            # CPU, docs/model.md). Right padding changes no real token's output there: a real query
            # sees only earlier keys, all real, at the same positions; pad rows are ignored downstream.
            mask = None if plain_causal else build_mask(attention_mask, s, self.cfg.sliding_window)
            # Pad tokens skip every matmul but attention's (see Unpad; docs/model.md measures it).
            unpad = Unpad.of(tokens)
            if unpad is not None:
                h = unpad.pack(h)
        cos, sin = rope_tables(*rope_cos_sin(pos, self.cfg, h.dtype))
        run = layer_fn or _call_layer
        for i, layer in enumerate(self.layers):
            last = last_only and i == len(self.layers) - 1
            h = run(layer, h, cos, sin, mask, None if caches is None else caches[i], start, tokens, unpad, last)
        if last_only and not self.layers:
            h = last_position(h, unpad)
        unpad = None if last_only else unpad
        h = self.norm(h) if self.norm is not None else h
        return h if unpad is None else unpad.unpack(h)


class CausalLM(nn.Module):
    """Backbone + LM head. ``model(input_ids [B, S])`` -> logits [B, S, vocab] (float of the weights)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                caches: list[KVCache] | None = None, start: int | torch.Tensor = 0) -> torch.Tensor:
        return self.lm_head(self.model(input_ids, attention_mask, caches, start))

    def save_pretrained(self, path: str, max_shard_bytes: int | None = None) -> None:
        """Write an HF checkpoint directory (config.json + safetensors); see checkpoint.py."""
        save_pretrained(self, path, max_shard_bytes or DEFAULT_MAX_SHARD_BYTES)


class ValueModel(nn.Module):
    """Backbone + ``score`` head: one scalar per token, values [B, S] (critic and reward models)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.score = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.score(self.model(input_ids, attention_mask)).squeeze(-1)

    def save_pretrained(self, path: str, max_shard_bytes: int | None = None) -> None:
        """Write an HF checkpoint directory (config.json + safetensors); see checkpoint.py."""
        save_pretrained(self, path, max_shard_bytes or DEFAULT_MAX_SHARD_BYTES)
