"""Per-model numbers the estimator needs: parameters per stage, FLOPs per token, bytes per token.

Derived from ``param_shapes`` (the same HF names the checkpoint and ShardMap use), so a preset's
costs follow its real shapes (GQA, tied embeddings, value heads) rather than a ``12 h^2`` rule.

Mixture of experts: memory holds every expert (``layer_params``), a token computes with its top-k
(``layer_active_params``); both are averages over the layers, since Qwen3-MoE may mix dense and
sparse layers. Experts are sharded over tp (docs/parallel.md), so the MoE block's communication is
the tp all-reduce a dense MLP has (no all-to-all): the estimator's tp term covers it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .. import cpu_features
from ..model.config import ModelConfig, active_params, num_params, param_shapes

BF16 = 2  # bytes per parameter / activation element in mixed precision


@dataclass(frozen=True)
class ModelCosts:
    cfg: ModelConfig
    value_head: bool
    layer_params: int  # one decoder layer (the mean over layers; every expert counted)
    embed_params: int
    head_params: int  # lm_head (or the tied embedding's copy on the last stage) or the value head
    final_norm: int
    layer_tensors: int = 9  # parameter tensors of one decoder layer
    layer_active_params: int = 0  # what one token computes with in a layer (top-k experts); 0: = layer_params

    def __post_init__(self) -> None:
        if not self.layer_active_params:
            object.__setattr__(self, "layer_active_params", self.layer_params)

    def stage_tensors(self, pp: int) -> int:
        """Parameter tensors on the largest pipeline stage: its layers', plus embedding, norm, head."""
        return -(-self.cfg.num_hidden_layers // pp) * self.layer_tensors + 3

    @property
    def total_params(self) -> int:
        tied = self.cfg.tie_word_embeddings and not self.value_head
        return (self.cfg.num_hidden_layers * self.layer_params + self.embed_params + self.final_norm
                + (0 if tied else self.head_params))

    def stage_params(self, layers: int, first: bool, last: bool, pp: int) -> int:
        """Parameters held by one pipeline stage (before TP sharding). With tied embeddings and pp>1
        the last stage keeps its own copy of the embedding as the head (as Megatron does)."""
        n = layers * self.layer_params
        if first:
            n += self.embed_params
        if last:
            n += self.final_norm
            tied = self.cfg.tie_word_embeddings and not self.value_head
            if not tied or pp > 1 or not first:
                n += self.head_params
        return n

    def stage_params_all(self, pp: int) -> tuple[int, ...]:
        """Parameters of each pipeline stage, in order (layout/mesh.py stage_layers' split: the
        first L % pp stages one layer more; the embedding on the first, norm and head on the last)."""
        base, extra = divmod(self.cfg.num_hidden_layers, pp)
        return tuple(self.stage_params(base + (1 if s < extra else 0), s == 0, s == pp - 1, pp) for s in range(pp))

    def max_stage_params(self, pp: int) -> int:
        return max(self.stage_params_all(pp))

    def matmul_flops_per_token(self) -> float:
        """Forward FLOPs per token outside attention scores: 2 x every matmul weight (embedding
        lookups are gathers, not matmuls)."""
        return 2.0 * (self.cfg.num_hidden_layers * self.layer_active_params + self.head_params)

    def attn_flops(self, new_tokens: int, context: int) -> float:
        """Forward FLOPs of QK^T and AV for ``new_tokens`` tokens attending (causally) to a
        context that ends at ``context``: 4 * q_size per (query, key) pair per layer."""
        start = context - new_tokens
        pairs = new_tokens * start + new_tokens * (new_tokens + 1) / 2
        return 4.0 * self.cfg.q_size * pairs * self.cfg.num_hidden_layers

    def kv_bytes_per_token(self, tp: int, dtype_bytes: int = BF16) -> float:
        """KV cache bytes per token per layer on one TP rank (KV heads are replicated when tp
        exceeds them, so a rank holds at least one)."""
        heads = max(1, self.cfg.num_key_value_heads // tp)
        return 2 * heads * self.cfg.head_dim * dtype_bytes

    def act_bytes_per_token_layer(self, tp: int, dtype_bytes: int = BF16, cpu: bool = False, keys: int = 0) -> float:
        """Activation memory a training forward keeps for the backward, per token per layer on one
        TP rank, as the runtime's layers keep it (model/transformer.py, moe.py; no sequence
        parallelism, no dropout): each RMSNorm its float32 input, its normalised output cast back
        and its scaled output (the next matmuls' input), unsharded; attention the rotated q and k,
        v, SDPA's output and its log-sum-exp (FlashAttention: no score matrix), Qwen3's q/k norms'
        float32 copies and casts; a dense SwiGLU MLP gate, up, silu(gate) and their product; a MoE
        block the router's logits and float32 probabilities and, per expert, its tokens' input,
        SwiGLU intermediates and output. Under the memory worst case of a dry run (model/
        worst_case.py) every token's top-k experts are on this rank: min(k, experts per rank) of
        them take every token. (Korthikanti et al. 2022's h(10 + 24/t) counts a GPT layer in bf16
        with 2-byte LayerNorm inputs, a 4h GeLU MLP and dropout masks: not this layer.) ``cpu``: bf16
        attention on a CPU runs in float32 (model/attention.py): SDPA keeps float32 q, k, v and
        output, and o_proj the output cast back; over at most cpu_features.SHORT_ATTENTION_KEYS
        ``keys`` (the row length) on a CPU with bf16 dot products it is short_attention instead,
        which keeps the rotated q, the key and value heads repeated to the query heads, the
        float32 probabilities and their bf16 cast per (query, key), and o_proj's input."""
        cfg, dt, w = self.cfg, dtype_bytes, max(4, dtype_bytes)
        h = cfg.hidden_size
        q, kv = cfg.q_size / tp, max(1, cfg.num_key_value_heads // tp) * cfg.head_dim
        norms = 2 * ((w + 2 * dt) * h + 4)  # + the float32 rsqrt of each row
        heads = cfg.q_size / cfg.head_dim / tp
        attn = (2 * q + 2 * kv) * dt + 4 * heads
        if cpu and dt == 2 and cpu_features.short_attention(True, keys):
            attn = 4 * q * dt + heads * keys * (4 + dt)
        elif cpu and dt < 4:
            attn = (2 * q + 2 * kv) * 4 + q * dt + 4 * heads
        if cfg.qk_norm:  # per head: float32 copy, cast back, rsqrt
            attn += (w + dt) * (q + kv) + 4 * (heads + kv / cfg.head_dim)
        return norms + attn + self._ffn_mean(tp, lambda i: 4 * i * dt, self._moe_saved(tp, dt))

    def _moe_saved(self, tp: int, dt: int) -> float:
        cfg = self.cfg
        if not cfg.num_experts:
            return 0.0
        k = cfg.num_experts_per_tok
        router = 4 * cfg.num_experts + 12 * k + 4  # float32 softmax, top-k values and ids, their sum
        # per expert: its tokens' input copy, SwiGLU's four, the output, the weighted output (index_add_
        # keeps its source), the routing weight and the row / slot ids
        per_expert = (3 * cfg.hidden_size + 4 * cfg.moe_intermediate_size + 1) * dt + 16
        return router + min(cfg.num_experts_per_tok, cfg.num_experts // tp) * per_expert

    def _ffn_mean(self, tp: int, dense, moe: float) -> float:
        """The MLP term averaged over the layers (Qwen3-MoE may mix dense and sparse ones)."""
        cfg = self.cfg
        n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
        n = cfg.num_hidden_layers
        return (n_moe * moe + (n - n_moe) * dense(cfg.intermediate_size / tp)) / n

    def infer_bytes_per_token(self, tp: int, dtype_bytes: int = BF16, cpu: bool = False, keys: int = 0) -> float:
        """The most bytes per token one decoder layer holds at once in a forward without autograd
        (inference, a prefill), as model/transformer.py runs it: the layer's input (the caller
        holds it), the attention output and the residual sum, then the larger of the
        post-attention RMSNorm's float32 copy and square, the MLP's three intermediates beside
        the normalised input, or attention's q, k, v and rotation temporaries (the rotated q
        and k beside the originals: 4 q + 2 kv widths); and rope's cos and sin. ``cpu`` and
        ``keys`` as act_bytes_per_token_layer's: short_attention holds the key and value heads
        repeated to the query heads and, per (query, key), the masked scores, their float32 copy
        and the float32 probabilities softmax computes from it."""
        cfg, dt, w = self.cfg, dtype_bytes, max(4, dtype_bytes)
        h = cfg.hidden_size
        copy = w if dt < w else 0  # float32 copy of a bf16 tensor (none when it is already float32)
        q, kv = cfg.q_size / tp, max(1, cfg.num_key_value_heads // tp) * cfg.head_dim
        norm = 3 * dt * h + (copy + w) * h
        attn = 2 * dt * h + (4 * q + 2 * kv) * dt
        if cfg.qk_norm:  # q's RMSNorm over heads: its float32 copy and square beside q, k and v
            attn = max(attn, 2 * dt * h + (q + 2 * kv) * dt + (copy + w) * q)
        if cpu and dt == 2 and cpu_features.short_attention(True, keys):
            heads = cfg.q_size / cfg.head_dim / tp
            attn = max(attn, 2 * dt * h + (3 * q + 2 * kv) * dt + heads * keys * (dt + 8))
        if cfg.num_experts:
            # one expert at a time, every token: beside the four above, the block's output, the
            # previous expert's output, this one's input copy and three intermediates; the router's
            # logits, top-k ids and weights, the row and slot ids
            e, k = cfg.moe_intermediate_size, cfg.num_experts_per_tok
            moe = (7 * h + 3 * e) * dt + dt * cfg.num_experts + (8 + 4) * k + 16
        else:
            moe = 0.0
        ffn = self._ffn_mean(tp, lambda i: (4 * h + 3 * i) * dt, moe)
        return max(norm, attn, ffn) + 2 * cfg.head_dim * dt  # + rope's cos and sin

    def head_bytes_per_token(self, tp: int, dtype_bytes: int = BF16, train: bool = False) -> float:
        """The output head's peak per token on the last stage: a language model's vocabulary slice
        of logits, its float32 copy, shifted logits and their exponentials (parallel/tensor.py
        vocab_parallel_logprobs), beside the normalised hidden state; in training also their
        gradient, and the final RMSNorm's saved tensors (its backward's float32 temporaries
        when larger than the logits'). A value head's one column is negligible. Inference with
        one tp rank takes torch.logsumexp instead, which holds one temporary of the logits' size
        (its shifted logits, exponentiated in place), not two."""
        dt, w, h = dtype_bytes, max(4, dtype_bytes), self.cfg.hidden_size
        copy = w if dt < w else 0
        temps = 1 if tp == 1 and not train else 2
        logits = 0.0 if self.value_head else (dt + copy + temps * w + (w if train else 0)) * self.cfg.vocab_size / tp
        if not train:
            return dt * h + logits
        return (w + 2 * dt) * h + max(logits, 4 * w * h)

    def fused_decode_bytes(self, pp: int, tp: int, dtype_bytes: int, packed: bool = False) -> float:
        """Per TP rank, the second copy of the largest stage's weights that decoding on a CPU makes
        (model/decode_weights.py): in bf16 its fused q|k|v and gate|up; ``packed`` (eager float32),
        oneDNN's packed q|k|v, o, gate|up, down (a MoE layer's experts stay unpacked) and LM head."""
        cfg = self.cfg
        kv = max(1, cfg.num_key_value_heads // tp) * cfg.head_dim
        per_layer = cfg.hidden_size * (cfg.q_size / tp + 2 * kv) + (cfg.q_size / tp * cfg.hidden_size if packed else 0)
        n_dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
        mlp = (3 if packed else 2) * cfg.hidden_size * cfg.intermediate_size / tp
        per_layer += n_dense / cfg.num_hidden_layers * mlp
        head = self.head_params / tp if packed and not self.value_head else 0
        return (-(-cfg.num_hidden_layers // pp) * per_layer + head) * dtype_bytes

    @property
    def out_width(self) -> int:
        """Width of the output head: the vocabulary, or 1 for a value head."""
        return 1 if self.value_head else self.cfg.vocab_size


@lru_cache(maxsize=256)
def model_costs(cfg: ModelConfig, value_head: bool = False) -> ModelCosts:
    shapes = param_shapes(cfg, value_head)

    def size(shape: tuple[int, ...]) -> int:
        n = 1
        for s in shape:
            n *= s
        return n

    layers = cfg.num_hidden_layers
    layer = sum(size(s) for k, s in shapes.items() if k.startswith("model.layers.")) // layers
    active = layer - (num_params(cfg, value_head) - active_params(cfg, value_head)) // layers
    embed = size(shapes["model.embed_tokens.weight"])
    if value_head:
        head = size(shapes["score.weight"])
    else:
        head = cfg.vocab_size * cfg.hidden_size
    tensors = -(-sum(1 for k in shapes if k.startswith("model.layers.")) // layers)
    return ModelCosts(cfg, value_head, layer, embed, head, size(shapes["model.norm.weight"]), tensors, active)
