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
from .attention import Attention, rope_tables
from .norm import RMSNorm


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
