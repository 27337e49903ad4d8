"""The estimator's building blocks (plan/estimator.py): a call's context (model costs, hardware,
layout, links), one micro-batch's forward (or forward + backward) through the slowest stage, and a
pipeline of micro-batches over those steps. Pure Python."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..layout.mesh import Layout
from .call_spec import Links
from .hardware import Hardware
from .model_costs import ModelCosts


@dataclass(frozen=True)
class Ctx:
    mc: ModelCosts
    hw: Hardware
    lay: Layout
    links: Links
    train_compiled: bool = False  # train.compile, where the runtime applies it (tp = 1, dense layers)
    gen_compiled: bool = False  # gen.compile, where it applies (tp = 1)

    def speed(self, kind: str) -> float:
        """The hardware's compiled / eager factor of the layers for ``kind`` where it runs compiled, else 1
        (an MoE model's prefill stays eager under gen.compile: model/compiled_layers.py prefill_layer)."""
        moe_prefill = kind == "prefill" and bool(self.mc.cfg.num_experts)
        on = (self.gen_compiled and not moe_prefill) if kind in ("prefill", "decode") else self.train_compiled
        return self.hw.compiled.of(kind) if on else 1.0

    @property
    def stage_layers(self) -> int:
        return math.ceil(self.mc.cfg.num_hidden_layers / self.lay.pp)

    @property
    def frac(self) -> float:
        return self.stage_layers / self.mc.cfg.num_hidden_layers

    @property
    def flops(self) -> float:
        return self.hw.flops_at(self.mc.cfg.hidden_size, self.lay.tp)

    @property
    def hbm_bw(self) -> float:
        """Bandwidth a step reaches: the datasheet figure times the fitted share (GPU presets)."""
        return self.hw.hbm_bw * self.hw.hbm_eff

    @property
    def stage_param_bytes(self) -> float:
        return self.mc.max_stage_params(self.lay.pp) / self.lay.tp * self.hw.dtype_bytes

    @property
    def stage_share(self) -> tuple[float, ...]:
        """Each pipeline stage's parameters over the largest stage's (Estimate.stage_share); () at pp = 1."""
        if self.lay.pp == 1:
            return ()
        per = self.mc.stage_params_all(self.lay.pp)
        top = max(per)
        return tuple(p / top for p in per)


def measured_time(fit, units: float, scale: float, tp: int) -> float:
    return fit.latency + fit.sec_per_byte * units * scale / tp


def forward_step(c: Ctx, b: int, new: int, ctx: int, backward: bool = False, prefill: bool = False,
                  recompute: bool = False) -> tuple[float, dict]:
    """One micro-batch of ``b`` sequences, ``new`` new tokens each (context ending at ``ctx``)
    through the slowest stage: compute + TP all-reduces + the activation send to the next stage.
    ``prefill``: only the last position goes through the output head. ``recompute`` (activation
    checkpointing, with ``backward``): the backward runs each layer's forward again first."""
    mult = 3.0 if backward else 1.0
    redo = recompute and backward
    fits = c.hw.layer_fits(c.mc.cfg.hidden_size)
    head_rows = b if prefill else b * new
    speed, redo_speed = c.speed("prefill" if prefill else "fwd_bwd" if backward else "fwd"), c.speed("fwd")
    if fits is not None:  # a measured profile: the model code's own timings, scaled by size
        fit, fixed = (fits.fwd_bwd, fits.fixed_fwd_bwd) if backward else (fits.fwd, fits.fixed_fwd)
        if prefill:
            fixed = fits.fixed_decode  # one head row per sequence, as a decoding step
        head_scale = c.mc.head_params / fits.head_params
        per_layer = c.mc.layer_active_params / fits.layer_params
        compute = (c.stage_layers * measured_time(fit, b * new, per_layer, c.lay.tp) * speed
                   + measured_time(fixed, b if prefill else b * new, head_scale, c.lay.tp))
        if redo:  # the layers' forward again (the head is not checkpointed)
            compute += c.stage_layers * measured_time(fits.fwd, b * new, per_layer, c.lay.tp) * redo_speed
    else:
        layer_flops = (2.0 * c.mc.cfg.num_hidden_layers * c.mc.layer_active_params * b * new
                       + b * c.mc.attn_flops(new, ctx))
        flops = layer_flops * c.frac + 2.0 * c.mc.head_params * head_rows
        # A pass reads the stage's weights at least once (three times with backward): with few
        # tokens it is bandwidth-bound, as a decoding step is; every pass pays the step overhead.
        compute = max(mult * flops / c.lay.tp / c.flops, mult * c.stage_param_bytes / c.hbm_bw) * speed
        if redo:  # the layers' forward again: their FLOPs, or one more read of their weights
            compute += max(layer_flops * c.frac / c.lay.tp / c.flops, c.stage_param_bytes / c.hbm_bw) * redo_speed
    overhead = (2 if backward else 1) * c.hw.step_overhead if fits is None else 0.0
    act = b * new * c.mc.cfg.hidden_size * c.hw.dtype_bytes
    n_ar = (4 if backward else 2) * c.stage_layers + (2 * c.stage_layers if redo else 0)
    tp = n_ar * c.hw.all_reduce(act, c.lay.tp, c.links.tp)
    pp = (2 if backward else 1) * c.hw.p2p(act, c.links.pp) if c.lay.pp > 1 else 0.0
    parts = {"compute": compute, "tp_comm": tp, "pp_comm": pp}
    if overhead:
        parts["overhead"] = overhead
    return compute + overhead + tp + pp, parts


def add_parts(acc: dict, part: dict, times: float) -> None:
    for k, v in part.items():
        acc[k] = acc.get(k, 0.0) + v * times


def busy_share(c: Ctx, m: int) -> float:
    """The share of a pipelined call's ranks computing at once: each stage works m of the m + pp - 1
    stage steps (with m = 1 the stages take turns, one at a time)."""
    return m / (m + c.lay.pp - 1)


def pipeline_time(c: Ctx, m: int, step: float, parts: dict, acc: dict) -> float:
    """m micro-batches through pp stages: (m + pp - 1) steps; the pp - 1 extra ones are the bubble."""
    add_parts(acc, parts, m)
    acc["bubble"] = acc.get("bubble", 0.0) + (c.lay.pp - 1) * step
    return (m + c.lay.pp - 1) * step
