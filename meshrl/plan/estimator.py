"""Predicted time and peak memory of one call under (mesh, layout, micro-batches) (pure Python).

The model, per call kind (``docs/planner.md`` derives each term):

- forward / prefill / train: compute-bound, FLOPs = 2 x matmul params x tokens + causal attention
  (4 q_size per query-key pair per layer); backward = 2 x forward. A pipeline of ``pp`` stages
  and ``m`` micro-batches takes ``(m + pp - 1)`` stage steps (GPipe / 1F1B bubble).
- decoding: each step reads the stage's weights and the KV cache from memory, so a step costs
  ``max(bytes / HBM bandwidth, FLOPs / FLOP/s)``; as the runtime generates (parallel/generate.py,
  generate_micro.py), with pp > 1 a replica's batch is split into the plan's m micro-batches in
  flight, each stage working on a different one: a decoding round of the whole batch takes the
  longer of m steps of the last stage and one micro-batch's trip through the pp stages and back
  (its stage steps, the hidden-state sends and the token return); m = 1 is the whole batch
  passing the stages in turn.
- TP: 2 all-reduces of the activations per layer forward, 2 more backward (Megatron-LM);
  generation all-gathers the vocabulary-parallel logits each step. PP: one activation send per
  stage boundary per micro-batch. DP: per optimizer step, the bucketed gradient all-reduce and
  ZeRO-1's bucketed all-gather of the updated parameters. Optimizer: AdamW reads and writes 28 B per parameter.
- memory per device: bf16 weights of the largest stage / tp; a trained role adds bf16 gradients
  and 12 B/param of fp32 Adam state sharded over dp (ZeRO-1; Rajbhandari et al. 2020); plus
  activations (the tensors meshrl's layers keep for the backward, model_costs.py) and the KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..layout.mesh import Layout
from .call_spec import CallSpec, Estimate, Links, RunShape, mesh_links  # noqa: F401 (the estimator's API)
from .hardware import Hardware
from .model_costs import ModelCosts, model_costs

ADAM_STATE_BYTES = 12  # fp32 master weights + m + v per parameter (ZeRO paper, K = 12)
ADAM_STEP_BYTES = 28  # read master, m, v (12) + bf16 grad (2); write master, m, v (12) + bf16 param (2)
LOGIT_BYTES = 4  # logits are kept in fp32 for the softmax / log-probs
DP_BUCKET_BYTES = 25 << 20  # train.grad_bucket_mb's default (parallel/data.py BUCKET_BYTES); RunShape has the setting
NO_LINKS = Links()  # every group within one node
DECODE_POINTS = 8  # decoding time is integrated over the context length at this many midpoints


@dataclass(frozen=True)
class _Ctx:
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


def _measured(fit, units: float, scale: float, tp: int) -> float:
    return fit.latency + fit.sec_per_byte * units * scale / tp


def _forward_step(c: _Ctx, b: int, new: int, ctx: int, backward: bool = False, prefill: bool = False,
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
        compute = (c.stage_layers * _measured(fit, b * new, per_layer, c.lay.tp) * speed
                   + _measured(fixed, b if prefill else b * new, head_scale, c.lay.tp))
        if redo:  # the layers' forward again (the head is not checkpointed)
            compute += c.stage_layers * _measured(fits.fwd, b * new, per_layer, c.lay.tp) * redo_speed
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


def _decode_step(c: _Ctx, b: int, ctx: int, head: bool = True) -> tuple[float, dict]:
    """One decoding step of ``b`` sequences at context ``ctx`` on one stage of the largest size:
    its layers, and with ``head`` the output head and the token pick (the last stage)."""
    mc = c.mc
    flops = b * (2.0 * mc.layer_active_params * c.stage_layers + mc.attn_flops(1, ctx) * c.frac
                 + (2.0 * mc.head_params if head else 0.0)) / c.lay.tp
    kv = b * ctx * c.stage_layers * mc.kv_bytes_per_token(c.lay.tp, c.hw.dtype_bytes)
    head_bytes = mc.head_params / c.lay.tp * c.hw.dtype_bytes
    mem = (c.stage_param_bytes - (0.0 if head else head_bytes) + kv) / c.hbm_bw
    compute = flops / c.flops * c.speed("decode")
    overhead = c.hw.step_overhead  # kernel launches and host work of one stage step (GPU presets)
    fits = c.hw.layer_fits(mc.cfg.hidden_size)
    if fits is not None:  # measured decoding steps already include their memory traffic
        mem = 0.0
        compute = (c.stage_layers * _measured(fits.decode, b, mc.layer_active_params / fits.layer_params, c.lay.tp)
                   * c.speed("decode"))
        if head:
            compute += _measured(fits.fixed_decode, b, mc.head_params / fits.head_params, c.lay.tp)
    act = b * mc.cfg.hidden_size * c.hw.dtype_bytes
    tp = 2 * c.stage_layers * c.hw.all_reduce(act, c.lay.tp, c.links.tp)
    if head:
        tp += c.hw.all_gather(b * mc.out_width * c.hw.dtype_bytes, c.lay.tp, c.links.tp)  # logits for sampling
    pp = c.hw.p2p(act, c.links.pp) if c.lay.pp > 1 and not head else 0.0
    if fits is not None:
        overhead = 0.0  # measured steps include it
    parts = {"decode_mem" if mem >= compute else "compute": max(mem, compute), "tp_comm": tp, "pp_comm": pp}
    if overhead:
        parts["overhead"] = overhead
    return max(mem, compute) + overhead + tp + pp, parts


def _token_pass(c: _Ctx, b: float, ctx: int, m: int) -> tuple[float, dict]:
    """One decoding step of one micro-batch of ``b`` rows through every stage and back: pp - 1
    stages hand their output on, the last one picks the token, which comes back to the others."""
    t, parts = _decode_step(c, b, ctx, head=True)
    if c.lay.pp > 1:
        mid, mid_parts = _decode_step(c, b, ctx, head=False)
        t += (c.lay.pp - 1) * mid
        _add(parts, mid_parts, c.lay.pp - 1)
        hops = _hops(c, b, m)
        t += hops
        parts["pp_comm"] += hops
    return t, parts


def _decode_round(c: _Ctx, b: float, m: int, ctx: int) -> tuple[float, dict, float]:
    """One decoding step of the whole batch, ``m`` micro-batches of ``b`` rows in flight
    (parallel/generate_micro.py): the last stage (the slowest: it holds the head) works m steps a
    round, and no micro-batch's next step can start before its tokens are back, so the round
    takes the longer of the two. -> (seconds, breakdown, busy stage-seconds of the round)."""
    trip, parts = _token_pass(c, b, ctx, m)
    last, last_parts = _decode_step(c, b, ctx, head=True)
    hops = _hops(c, b, m) if c.lay.pp > 1 else 0.0
    busy = m * (trip - hops)  # every micro-batch's stage steps, over all stages
    if m * last > trip:
        parts = {k: v * m for k, v in last_parts.items()}
        return m * last, parts, busy
    return trip, parts, busy


def _hops(c: _Ctx, b: int, m: int) -> float:
    """What a trip through the pp stages pays beyond compute and hidden-state bytes: measured per
    stage boundary where the profile has it (Hardware.pipeline_hop: the next stage's wake-up and
    per-call work, the tokens' way back), else the tokens' return: one p2p message with
    micro-batches in flight, a broadcast (a binomial tree, ceil(log2 pp) hops) with one."""
    if c.hw.pipeline_hop > 0:
        return (c.lay.pp - 1) * c.hw.pipeline_hop
    hops = 1 if m > 1 else math.ceil(math.log2(c.lay.pp))
    return hops * c.hw.p2p(2 * b * 8, c.links.pp)  # tokens, log-probs in float64


def gen_micro_batches(layout: Layout, m: int, rows: int) -> int:
    """Micro-batches the runtime's generation runs in flight: the plan's m (1: the stages take
    turns on the whole batch), at most one a row; one without a pipeline."""
    return 1 if layout.pp == 1 else max(1, min(m, rows))


def _add(acc: dict, part: dict, times: float) -> None:
    for k, v in part.items():
        acc[k] = acc.get(k, 0.0) + v * times


def _busy_share(c: _Ctx, m: int) -> float:
    """The share of a pipelined call's ranks computing at once: each stage works m of the m + pp - 1
    stage steps (with m = 1 the stages take turns, one at a time)."""
    return m / (m + c.lay.pp - 1)


def _pipeline(c: _Ctx, m: int, step: float, parts: dict, acc: dict) -> float:
    """m micro-batches through pp stages: (m + pp - 1) steps; the pp - 1 extra ones are the bubble."""
    _add(acc, parts, m)
    acc["bubble"] = acc.get("bubble", 0.0) + (c.lay.pp - 1) * step
    return (m + c.lay.pp - 1) * step


def _generate(c: _Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    """As the runtime generates a replica's prompts (parallel/generate.py): with pp > 1 in
    ``gen_micro_batches`` micro-batches in flight (1: the stages in turn), prefills pipelined as
    an inference call's forwards, then decoding rounds of the whole batch (``_decode_round``)."""
    b = s_dp = math.ceil(spec.sequences(shape) / c.lay.dp)
    mb = gen_micro_batches(c.lay, m, b)
    bm = math.ceil(b / mb)
    acc: dict[str, float] = {}
    step, parts = _forward_step(c, bm, shape.prompt_len, shape.prompt_len, prefill=True)
    busy = mb * c.lay.pp * step
    if c.lay.pp == 1:
        t = step
        _add(acc, parts, 1)
    else:
        t = _pipeline(c, mb, step, parts, acc)  # (the head's share over-counted on the other stages: small)
        hops = _hops(c, bm, mb)  # the first tokens' way back
        t += hops
        acc["pp_comm"] = acc.get("pp_comm", 0.0) + hops
    # Decode: the prefill's logits give the first token, and the batch decodes until its longest
    # row ends (model/generation.decode_loop stops when no row is alive); integrated over the
    # growing context at DECODE_POINTS midpoints. Compacted, only the rows still alive compute:
    # on average b x mean / longest of them (weights and step overheads are paid per step regardless).
    longest = shape.longest(b)
    n_dec = max(0, round(longest) - 1)
    alive = bm * shape.mean_len / max(longest, 1.0) if shape.compact else bm
    n_pts = min(DECODE_POINTS, n_dec)
    per_pt = n_dec / max(n_pts, 1)
    for i in range(n_pts):
        ctx = shape.prompt_len + int((i + 0.5) * per_pt) + 1
        step, parts, busy_round = _decode_round(c, alive, mb, ctx)
        t += per_pt * step
        busy += per_pt * busy_round
        _add(acc, parts, per_pt)
    seqs = spec.sequences(shape)
    mc = c.mc
    flops = seqs * (shape.prompt_len * mc.matmul_flops_per_token() + mc.attn_flops(shape.prompt_len,
                    shape.prompt_len))
    gen = shape.mean_len  # useful FLOPs: the tokens actually generated
    flops += seqs * (gen * mc.matmul_flops_per_token() + mc.attn_flops(gen, shape.prompt_len + gen))
    # KV cache: every row's slots for the whole budget; a compacting (paged) engine holds the tokens
    # of the rows it runs, on average the prompt and the mean response. Logits and the prefill's
    # working set (a layer's forward without autograd): one micro-batch's at a time.
    kv_len = shape.prompt_len + shape.mean_len if shape.compact else shape.seq_len
    kv = s_dp * kv_len * c.stage_layers * mc.kv_bytes_per_token(c.lay.tp, c.hw.dtype_bytes)
    logits = bm * mc.out_width / c.lay.tp * LOGIT_BYTES
    prefill_act = bm * shape.prompt_len * mc.infer_bytes_per_token(c.lay.tp, c.hw.dtype_bytes)
    if c.hw.name == "cpu" and c.hw.dtype_bytes == 2:  # bf16 decoding on a CPU fuses q|k|v and gate|up: copies
        prefill_act += mc.fused_decode_bytes(c.lay.pp, c.lay.tp, c.hw.dtype_bytes)
    elif c.hw.name == "cpu" and c.hw.dtype_bytes == 4 and not c.gen_compiled and not shape.engine_copy:
        # eager float32 decoding packs its projections and LM head for oneDNN once per generation
        prefill_act += mc.fused_decode_bytes(c.lay.pp, c.lay.tp, c.hw.dtype_bytes, packed=True)
    # the share of the stages computing at once: their busy seconds over pp x the call's
    active = min(1.0, busy / (c.lay.pp * t)) if t > 0 else 1.0
    return Estimate(t, flops, c.stage_param_bytes, 0.0, kv + logits + prefill_act, acc, active=active)


def _generate_turns(c: _Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    """A generation call: one turn (``_generate``), or a multi-turn rollout (env.fn) as the runtime
    runs it (algo/multiturn.py): one generation per turn over the whole batch, each prefilling
    the conversation so far (RunShape.turn_shapes); time and FLOPs add up, memory is the largest
    turn's (each turn's caches are freed before the next)."""
    turns = shape.turn_shapes()
    if len(turns) == 1 and turns[0][1] is shape:
        return _generate(c, spec, shape, m)
    parts = [(w, _generate(c, spec, s, m)) for w, s in turns]
    acc: dict[str, float] = {}
    for w, e in parts:
        _add(acc, e.breakdown, w)
    t = sum(w * e.time_s for w, e in parts)
    peak = max((e for _, e in parts), key=lambda e: e.transient_bytes)
    active = sum(w * e.time_s * e.active for w, e in parts) / t if t > 0 else 1.0
    return Estimate(t, sum(w * e.flops for w, e in parts), peak.weights_bytes, 0.0, peak.transient_bytes, acc,
                    active=active)


def _inference(c: _Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    s_dp = math.ceil(spec.sequences(shape) / c.lay.dp)
    b = math.ceil(s_dp / m)
    s = round(shape.row_len(spec.sequences(shape)))
    acc: dict[str, float] = {}
    step, parts = _forward_step(c, b, s, s)
    t = _pipeline(c, m, step, parts, acc)
    seqs = spec.sequences(shape)
    flops = seqs * (s * c.mc.matmul_flops_per_token() + c.mc.attn_flops(s, s))
    # a micro-batch's forward without autograd: the larger of a layer's working set and the head's
    dt = c.hw.dtype_bytes
    act = b * s * max(c.mc.infer_bytes_per_token(c.lay.tp, dt), c.mc.head_bytes_per_token(c.lay.tp, dt))
    return Estimate(t, flops, c.stage_param_bytes, 0.0, act, acc, active=_busy_share(c, m))


def _train(c: _Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    steps = shape.epochs * shape.mini_batches
    s_dp = math.ceil(spec.sequences(shape) / c.lay.dp / shape.mini_batches)
    b = math.ceil(s_dp / m)
    s = round(shape.row_len(spec.sequences(shape)))
    acc: dict[str, float] = {}
    step, parts = _forward_step(c, b, s, s, backward=True, recompute=shape.activation_checkpointing)
    t_mb = _pipeline(c, m, step, parts, {})
    grad_bytes = c.stage_param_bytes
    bucket = shape.grad_bucket_bytes
    # DP as the runtime's ZeRO-1 runs it (meshrl/parallel/data.py): the gradients are all-reduced
    # in buckets of train.grad_bucket_mb, then the updated shards are all-gathered in buckets of
    # that size per rank; one collective (and one latency) per bucket.
    n_ar = max(1, math.ceil(grad_bytes / bucket))
    n_ag = max(1, math.ceil(grad_bytes / c.lay.dp / bucket))
    reduce = n_ar * c.hw.all_reduce(grad_bytes / n_ar, c.lay.dp, c.links.dp)
    if shape.overlap_grad_reduce and c.lay.dp > 1:
        # parallel/overlap.py: each bucket is all-reduced as the last micro-batch's backward fills
        # it, so only what outlasts that backward (2/3 of its step) is exposed, and at least the
        # last bucket's, which waits for the backward's end
        reduce = max(reduce / n_ar, reduce - 2.0 / 3.0 * step)
    dp = reduce + n_ag * c.hw.all_gather(grad_bytes / n_ag, c.lay.dp, c.links.dp)
    opt = ADAM_STEP_BYTES * (grad_bytes / c.hw.dtype_bytes) / c.lay.dp / c.hw.hbm_bw
    opt += c.mc.stage_tensors(c.lay.pp) * c.hw.optimizer_tensor_s  # every rank steps a chunk of each tensor
    _add(acc, parts, m * steps)
    acc["bubble"] = (c.lay.pp - 1) * step * steps
    acc["dp_comm"] = dp * steps
    acc["optimizer"] = opt * steps
    seqs = spec.sequences(shape)
    flops = 3 * shape.epochs * seqs * (s * c.mc.matmul_flops_per_token() + c.mc.attn_flops(s, s))
    # ZeRO-1 as the runtime keeps it (parallel/data.py ZeroAdamW): fp32 m and v for 1/dp of each
    # parameter, plus an fp32 master copy of that 1/dp when the weights are not fp32 (bf16)
    n_local = grad_bytes / c.hw.dtype_bytes
    # a float32 or float64 parameter is its own master (m and v in its dtype); bf16 keeps fp32 ones
    wide = c.hw.dtype_bytes >= 4
    state = (2 * c.hw.dtype_bytes if wide else ADAM_STATE_BYTES) * n_local / c.lay.dp
    in_flight = min(m, c.lay.pp)
    layer_act = b * s * c.mc.act_bytes_per_token_layer(c.lay.tp, c.hw.dtype_bytes, cpu=c.hw.name == "cpu")
    if shape.activation_checkpointing:  # each layer's input kept; one layer's activations while it recomputes
        act = in_flight * b * s * c.stage_layers * c.mc.cfg.hidden_size * c.hw.dtype_bytes + layer_act
    else:
        act = in_flight * c.stage_layers * layer_act
    # the head (logits, their float32 copies and gradient) and the final norm, one micro-batch's
    logits = b * s * c.mc.head_bytes_per_token(c.lay.tp, c.hw.dtype_bytes, train=True)
    # Besides the gradients, the larger of two needs that never overlap in the runtime: the
    # backward's activations and logits; the optimizer step's buffers: fp32 copies of the gradient
    # chunks (bf16 weights), then ZeRO-1's all-gather bucket (this rank's chunks and every rank's,
    # dp + 1 chunks). The dp all-reduce adds nothing: the gradients are views of its bucket buffers
    # (parallel/overlap.py; with train.overlap_grad_reduce=false it concatenates one bucket at a
    # time, at most min(grad_bytes, bucket), never more than the gather bucket below).
    fp32_grads = 4 * n_local / c.lay.dp if not wide else 0.0
    gather = (1 + c.lay.dp) * min(grad_bytes / c.lay.dp, bucket) if c.lay.dp > 1 else 0.0
    transient = grad_bytes + max(act + logits, fp32_grads, gather)
    total = (t_mb + dp + opt) * steps
    if shape.recompute_actor and spec.role == "actor" and not spec.value_head:
        # the rollout-mismatch recompute (algo/mismatch.py): one forward over the replica's whole batch,
        # in the train call's micro-batch count (as algo/calls.py actor_train runs it)
        re = _inference(c, spec, shape, min(m, max_micro_batches(replace(spec, kind="inference"), shape, c.lay))).time_s
        acc["recompute"] = re
        total += re
    return Estimate(total, flops, c.stage_param_bytes, state, transient, acc, active=_busy_share(c, m))


def estimate_call(spec: CallSpec, shape: RunShape, layout: Layout, micro_batches: int, hw: Hardware,
                  links: Links = NO_LINKS) -> Estimate:
    """Time and per-device memory of ``spec`` under ``layout`` with ``micro_batches`` per DP rank
    (per mini-batch for train calls). The layout must suit the model (see Layout.check_model)."""
    # torch.compile where the runtime applies it: tp = 1 (tp's all-reduces stay eager), dense layers
    # (parallel/model.py, model/compiled_layers.py); the one-off compile is outside the price
    one = layout.tp == 1
    c = _Ctx(model_costs(spec.model, spec.value_head), hw, layout, links,
             train_compiled=one and shape.compile_layers and not spec.model.num_experts,
             gen_compiled=one and shape.compile_gen)
    run = {"generate": _generate_turns, "inference": _inference}.get(spec.kind, _train)
    est = run(c, spec, shape, micro_batches)
    if spec.kind == "generate" and shape.engine_copy:
        # the engine's weight load (gen.backend=vllm): the rank's slices read and written once, at
        # memory bandwidth, into a second copy that the engine keeps (meshrl/gen/vllm_engine.py)
        sync = 2 * c.stage_param_bytes / hw.hbm_bw
        est = replace(est, time_s=est.time_s + sync, weights_bytes=est.weights_bytes + c.stage_param_bytes,
                      breakdown={**est.breakdown, "weight_sync": sync})
    if not hw.call_host_s:
        return est
    return replace(est, time_s=est.time_s + hw.call_host_s, breakdown={**est.breakdown, "host": hw.call_host_s})


def max_micro_batches(spec: CallSpec, shape: RunShape, layout: Layout) -> int:
    """More micro-batches than sequences per DP rank (per mini-batch) would leave some empty."""
    per = spec.sequences(shape) / layout.dp
    if spec.kind == "generate" and layout.pp == 1:
        return 1  # one process per replica generates its prompts in one batch
    if spec.kind == "train":
        per /= shape.mini_batches
    return max(1, math.ceil(per))
