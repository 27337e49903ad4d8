"""``train.compile``: the decoder layers' forwards without a KV cache (training, reference, critic and
reward inference) and their backward through ``torch.compile``; with ``gen.compile``, a generation's
prefill too (``prefill_layer``: the layers writing their KV cache from slot 0).

Eager PyTorch runs a layer as ~35 kernels a forward and more a backward: the RMSNorms' casts, powers
and means, RoPE's halves, SwiGLU's product, residual adds, the padding-free layout's scatters.
Inductor fuses them into a few loops per layer; the matmuls and attention stay library calls. This
matters most where the matmuls are cheap next to the rest: bf16 on a CPU with AMX, whose matmuls are
several times faster than float32 ones while its elementwise kernels are not faster at all
(docs/model.md "bf16 on a CPU" and "Compiled layers" have the measurements).

One compiled function serves every layer (the layer is an argument: its parameters are graph
inputs, so a model compiles once, not once per layer), with dynamic shapes: batch, sequence and
packed-token counts change every iteration. A run compiles a handful of graphs (with and without
gradients, with and without padding; the second batch shape re-specialises once), each a few
seconds to compile on a CPU; later iterations reuse them. Generation's decode steps have their own compiled graph
(fixed shapes, meshrl/model/generation.py); its prefill, whose batch, width and token count change
every call, runs this same function with the cache as an argument (docs/model.md "Compiled layers"
measures it against eager).
MoE layers stay eager (their routing has data-dependent shapes). The numbers are those of the eager
layer up to the fused kernels' rounding (tests/model/test_compiled_layers.py).
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from .batch_layout import KVCache, Unpad
from .attention import compile_constants
from .transformer import DecoderLayer

RECOMPILE_LIMIT = 64  # graphs per compiled function: (batch buckets) x (cache buckets) x models


def before_compile() -> None:
    """What each torch.compile of these layers needs first, process-wide: dynamo's graphs-per-function
    limit (8) raised to RECOMPILE_LIMIT (dynamo has no per-function limit: the compiled decode step and
    compiled layers need more shapes than 8), and the layers' constants marked
    (attention.compile_constants)."""
    import torch._dynamo  # only when compiling (slow to import)

    cfg = torch._dynamo.config
    cfg.cache_size_limit = max(cfg.cache_size_limit, RECOMPILE_LIMIT)
    compile_constants()


def _layer_call(layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None, idx: torch.Tensor | None, token_mask: torch.Tensor | None,
                cache: KVCache | None = None, last: bool = False) -> torch.Tensor:
    """DecoderLayer.forward from slot 0 (no cache, or a prefill filling ``cache`` from its first
    slot), its Unpad rebuilt from tensors: cos [B, 1, S, D] is in the padded layout, so B and S are
    symbolic sizes of an input, not integers the graph would bake in."""
    unpad = None if idx is None else Unpad(idx, cos.shape[0], cos.shape[2])
    return DecoderLayer.forward(layer, h, cos, sin, mask, cache, 0, token_mask, unpad, last)


@cache
def _compiled_layer_call():
    before_compile()  # grad x padding x cache x shapes
    return torch.compile(_layer_call, dynamic=True)


@cache
def _compiled_prefill_call(device_type: str):
    """The prefill's own compiled function: inference only, so on a CPU with inductor's C++ wrapper,
    which takes less per prefill than the Python one (docs/model.md "Compiled layers")."""
    before_compile()
    options = {"cpp_wrapper": True} if device_type == "cpu" else None
    return torch.compile(_layer_call, dynamic=True, options=options)


def prefill_layer(layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mask: torch.Tensor | None, cache: KVCache | None, start: int | torch.Tensor,
                  token_mask: torch.Tensor | None, unpad: Unpad | None, last: bool = False) -> torch.Tensor:
    """A ``Backbone.forward`` ``layer_fn`` for a generation's prefill (gen.compile, tp = 1): a dense
    layer filling its cache from slot 0 runs the compiled function; any other call, the layer (and
    so does a cache carrying eager decoding's packed weights: decode_weights.make_caches)."""
    if layer.moe or cache is None or cache.packed is not None or not isinstance(start, int) or start != 0:
        return layer(h, cos, sin, mask, cache, start, token_mask, unpad, last)
    return _compiled_prefill_call(h.device.type)(layer, h, cos, sin, mask, None if unpad is None else unpad.idx,
                                                 token_mask, cache, last)


def compile_layers(layers: nn.ModuleList) -> int:
    """Route the cache-free forwards of the dense layers in ``layers`` through the one compiled
    function; -> how many layers were routed (a layer already routed is left as it is). Call before
    activation checkpointing wraps them."""
    fn = _compiled_layer_call()
    routed = 0
    for layer in layers:
        if layer.moe or getattr(layer, "_meshrl_compiled", False):
            continue
        layer._meshrl_compiled = True

        def run(h, cos, sin, mask, cache=None, start=0, token_mask=None, unpad=None, last=False,
                _layer=layer, _eager=layer.forward):
            if cache is not None or last:  # generation: the eager layer (or prefill_layer's graph)
                return _eager(h, cos, sin, mask, cache, start, token_mask, unpad, last)
            return fn(_layer, h, cos, sin, mask, None if unpad is None else unpad.idx, token_mask)

        layer.forward = run
        routed += 1
    return routed
