"""What a generation's decode runs on: one KV cache per layer, and the copies of the weights
made once per generation where they pay on a CPU.

- bf16 (fp16) on a CPU without bf16 dot products: q|k|v and gate|up concatenated, one matmul each
  (``fused_weights``), since oneDNN's small-row matmul pays a fixed cost per call (docs/model.md
  "bf16 on a CPU").
- eager float32, and bf16 on a CPU with bf16 dot products: every projection and the LM head
  reordered for oneDNN's matmul (``Packed``), as inductor prepacks them (docs/model.md "Packed weights").

Both are copies taken at the generation's start, so each optimizer step's new weights are the ones
used; the estimator prices them (plan/model_costs.py ``fused_decode_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import cpu_features
from . import worst_case
from .batch_layout import KVCache


def make_caches(model, batch: int, max_len: int, pack: bool = True, rows: int | None = None,
                keep: bool = False) -> list[KVCache]:
    """One static cache per local layer, sized for the heads this module actually holds, carrying
    the layer's fused projections where they pay (``fused_weights``) or, with ``pack`` (eager
    decoding), its projections and the LM head ordered for oneDNN where that applies
    (``pack_projections``). ``rows``: the batch the decode steps run at, when the prefill runs
    fewer (each distinct prompt once; None: ``batch``), the packed matmuls' row hint.
    ``keep``: those copies stay with the model for the next call while its weights are unchanged
    (``decode_copies``)."""
    layers = model.model.layers
    attn = layers[0].self_attn
    w = attn.k_proj.weight
    kv_heads = w.shape[0] // attn.head_dim
    caches = [KVCache(batch, kv_heads, max_len, attn.head_dim, w.dtype, w.device) for _ in layers]
    copies, whole = decode_copies(model, rows or batch, pack, keep), whole_cache_reads(w)
    for c, (packed, qkv, gate_up) in zip(caches, copies.layers, strict=True):
        c.packed, c.qkv, c.gate_up, c.whole_reads = packed, qkv, gate_up, whole
    if caches:
        caches[-1].head = copies.head
    return caches


@dataclass
class DecodeCopies:
    """The copies of a model's weights one generation decodes with: per local layer (PackedLayer or
    None, fused q|k|v weight and bias or None, fused gate|up or None), and the packed LM head or None."""

    layers: list[tuple]
    head: "Packed | None"


def decode_copies(model, rows: int, pack: bool, keep: bool) -> DecodeCopies:
    """``make_caches``' weight copies: packed (``pack`` and ``pack_projections``), fused
    (``fuse_projections``) or none. With ``keep``, they stay on the model and the next call takes
    them while every parameter is the same tensor at the same version (an in-place update, an
    optimizer step or a load, bumps it), rows and ``pack`` unchanged: an eval loop or `meshrl
    generate`'s batches pack once, at the cost of the copies held between calls. Without it
    (the RL runtime's rollouts: new weights every step, and memory the planner prices as held
    during the call only) nothing is held after the call, and a kept set is dropped."""
    kept = model.__dict__.pop("_meshrl_decode_copies", None)
    version = weights_version(model) if keep and not worst_case.active() else None
    key = None if version is None else (rows, pack, version)
    copies = kept[1] if key is not None and kept is not None and kept[0] == key else _copies(model, rows, pack)
    if key is not None:
        model.__dict__["_meshrl_decode_copies"] = (key, copies)
    return copies


def weights_version(model) -> tuple | None:
    """What identifies a module's weights' current values: each parameter's identity, storage and
    version counter; None where one is an inference tensor (made under torch.inference_mode), which
    has no version counter: its changes cannot be seen, so nothing is kept for it."""
    params = list(model.parameters())
    if any(p.is_inference() for p in params):
        return None
    return tuple((id(p), p.data_ptr(), p._version) for p in params)


def _copies(model, rows: int, pack: bool) -> DecodeCopies:
    layers = model.model.layers
    w = layers[0].self_attn.k_proj.weight
    if pack and pack_projections(w):
        head = lm_head_of(model)
        return DecodeCopies([(PackedLayer.of(layer, rows), None, None) for layer in layers],
                            None if head is None else Packed(head.weight, head.bias, rows))
    if fuse_projections(w):
        return DecodeCopies([(None, *fused_weights(layer)) for layer in layers], None)
    return DecodeCopies([(None, None, None) for _ in layers], None)


def lm_head_of(model) -> torch.nn.Module | None:
    """A CausalLM's ``lm_head``, a pipeline stage's ``head`` (None off the last stage)."""
    head = getattr(model, "lm_head", None)
    return head if head is not None else getattr(model, "head", None)


def head_call(model, caches: list[KVCache]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The LM head a generation runs: its packed copy where make_caches made one, else the module."""
    packed = caches[-1].head if caches else None
    return packed if packed is not None else lm_head_of(model)


def pack_projections(weight: torch.Tensor) -> bool:
    """Whether eager decoding runs each projection (and the LM head) through oneDNN's matmul on a
    copy of the weight reordered once per generation: float32 on a CPU, where MKL's GEMM of a
    decode step's few rows is the slow orientation (docs/model.md "Packed weights"). The packed
    matmul also gives every row the same bits whatever the batch it runs in, which F.linear does
    not. bf16 too where the CPU computes it natively (``native_bf16``; elsewhere fused_weights), not
    float64 (oneDNN has none), nor on a GPU. A CPU dry run's fake tensors take the path too (``Packed``
    holds a plain copy of the same bytes there), so that it holds the copies the run will."""
    return ((weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and native_bf16()))
            and worst_case.device_type(weight) == "cpu" and torch.backends.mkldnn.is_available()
            and (worst_case.active() or type(weight) in (torch.Tensor, torch.nn.Parameter)))


def whole_cache_reads(weight: torch.Tensor) -> bool:
    """Whether eager decode steps attend over whole KV buffers (KVCache.reads_whole): bf16 on a
    CPU, where the batched matmul (oneDNN's) copies the filled prefix of each (row, head), a strided
    batch, into a contiguous one at every step, as it does not in float32 (MKL's) (docs/model.md
    "Whole-cache reads"). A dry run's fake tensors take the path too."""
    return weight.dtype == torch.bfloat16 and worst_case.device_type(weight) == "cpu"


def native_bf16() -> bool:
    """Whether this CPU has bf16 dot products (AVX512-BF16 or AMX; meshrl/cpu_features.py): there
    oneDNN's packed bf16 matmul of a decode step's rows beats the unpacked one as in float32
    (docs/model.md "bf16 on a CPU"); without them bf16 is emulated and the fused projections are
    the better path."""
    return cpu_features.native_bf16()


class Packed:
    """y = x @ W^T + b through oneDNN's matmul on W reordered for it once (a generation's copy:
    each optimizer step's new weights are the ones packed at the next generation's start)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> None:
        # a dry run's fake tensors have no oneDNN layout: a plain copy of the same bytes stands in
        self.fake = worst_case.active()
        w = weight.detach()
        self.weight = w.clone() if self.fake else torch.ops.mkldnn._reorder_linear_weight(w, max(1, rows))
        self.bias = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fake:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


@dataclass
class PackedLayer:
    """A decoder layer's projections for one generation: q|k|v and gate|up concatenated (one
    matmul each), o and down; gate_up / down None for a MoE layer (its experts stay eager)."""

    qkv: Packed
    o: Packed
    gate_up: Packed | None
    down: Packed | None

    @classmethod
    def of(cls, layer, rows: int) -> "PackedLayer":
        (w, b), gate_up = fused_weights(layer)
        a = layer.self_attn
        mlp = None if layer.moe else layer.mlp
        return cls(Packed(w, b, rows), Packed(a.o_proj.weight, None, rows),
                   None if mlp is None else Packed(gate_up, None, rows),
                   None if mlp is None else Packed(mlp.down_proj.weight, None, rows))


def fuse_projections(weight: torch.Tensor) -> bool:
    """Whether decoding concatenates q/k/v and gate/up into one matmul each: with bf16 (fp16) weights
    on a CPU, where oneDNN's small-row matmul pays a fixed cost per call whatever its size, so one
    call instead of three (two) saves it (docs/model.md "bf16 on a CPU"). Not in float32 (no gain,
    and the same blocking as an unfused forward keeps tokens equal to it), nor on a GPU (the copy
    would hold a second set of weights in device memory)."""
    return worst_case.device_type(weight) == "cpu" and weight.dtype in (torch.bfloat16, torch.float16)


def fused_weights(layer) -> tuple[tuple[torch.Tensor, torch.Tensor | None] | None, torch.Tensor | None]:
    """A decoder layer's (q|k|v weight and bias, gate|up weight) for one generation: copies, made at
    its start, so each optimizer step's new weights are the ones used."""
    a = layer.self_attn
    projs = (a.q_proj, a.k_proj, a.v_proj)
    bias = None if a.q_proj.bias is None else torch.cat([p.bias for p in projs]).detach()
    qkv = (torch.cat([p.weight for p in projs]).detach(), bias)
    if layer.moe:
        return qkv, None
    return qkv, torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).detach()
