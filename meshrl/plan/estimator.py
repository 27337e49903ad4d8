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
  With pp > 1 each stage is priced on its own: its layers, the micro-batches 1F1B keeps in flight
  there (pp - i on stage i), the head's logits on the last stage only (Estimate.stage_transient).

This file prices inference and training calls and dispatches; a generation call's price is in
estimate_generate.py, the steps both build on (a micro-batch through a stage, a pipeline) in
estimate_steps.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..layout.mesh import Layout, stage_layers
from .call_spec import CallSpec, Estimate, Links, RunShape, mesh_links  # noqa: F401 (the estimator's API)
from .estimate_generate import LOGIT_BYTES, generate_turns, gen_micro_batches  # noqa: F401 (the estimator's API)
from .estimate_steps import Ctx, add_parts, busy_share, forward_step, pipeline_time
from .hardware import Hardware
from .model_costs import model_costs

ADAM_STATE_BYTES = 12  # fp32 master weights + m + v per parameter (ZeRO paper, K = 12)
ADAM_STEP_BYTES = 28  # read master, m, v (12) + bf16 grad (2); write master, m, v (12) + bf16 param (2)
DP_BUCKET_BYTES = 25 << 20  # train.grad_bucket_mb's default (parallel/data.py BUCKET_BYTES); RunShape has the setting
NO_LINKS = Links()  # every group within one node


def _inference(c: Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    s_dp = math.ceil(spec.sequences(shape) / c.lay.dp)
    b = math.ceil(s_dp / m)
    s = round(shape.row_len(spec.sequences(shape)))
    acc: dict[str, float] = {}
    step, parts = forward_step(c, b, s, s)
    t = pipeline_time(c, m, step, parts, acc)
    seqs = spec.sequences(shape)
    flops = seqs * (s * c.mc.matmul_flops_per_token() + c.mc.attn_flops(s, s))
    # a micro-batch's forward without autograd: a layer's working set, and on the last stage the
    # larger of it and the head's
    dt = c.hw.dtype_bytes
    layer = c.mc.infer_bytes_per_token(c.lay.tp, dt, cpu=c.hw.cpu, keys=s)
    head = c.mc.head_bytes_per_token(c.lay.tp, dt)
    stages = tuple(b * s * (max(layer, head) if i == c.lay.pp - 1 else layer) for i in range(c.lay.pp))
    return Estimate(t, flops, c.stage_param_bytes, 0.0, max(stages), acc, active=busy_share(c, m),
                    stage_transient=stages if c.lay.pp > 1 else (), stage_share=c.stage_share)


def _train(c: Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    steps = shape.epochs * shape.mini_batches
    s_dp = math.ceil(spec.sequences(shape) / c.lay.dp / shape.mini_batches)
    b = math.ceil(s_dp / m)
    s = round(shape.row_len(spec.sequences(shape)))
    acc: dict[str, float] = {}
    step, parts = forward_step(c, b, s, s, backward=True, recompute=shape.activation_checkpointing)
    t_mb = pipeline_time(c, m, step, parts, {})
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
    add_parts(acc, parts, m * steps)
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
    layer_act = b * s * c.mc.act_bytes_per_token_layer(c.lay.tp, c.hw.dtype_bytes, cpu=c.hw.cpu, keys=s)

    def activations(stage: int, layers: int) -> float:
        """1F1B keeps pp - stage micro-batches in flight on a stage (parallel/pipeline.py)."""
        in_flight = min(m, c.lay.pp - stage)
        if shape.activation_checkpointing:  # each layer's input kept; one layer's activations while it recomputes
            return in_flight * b * s * layers * c.mc.cfg.hidden_size * c.hw.dtype_bytes + layer_act
        return in_flight * layers * layer_act

    # the head (logits, their float32 copies and gradient) and the final norm, one micro-batch's, on
    # the last stage
    logits = b * s * c.mc.head_bytes_per_token(c.lay.tp, c.hw.dtype_bytes, train=True)
    # Besides the gradients, the larger of two needs that never overlap in the runtime: the
    # backward's activations and logits; the optimizer step's buffers: fp32 copies of the gradient
    # chunks (bf16 weights), then ZeRO-1's all-gather bucket (this rank's chunks and every rank's,
    # dp + 1 chunks). The dp all-reduce adds nothing: the gradients are views of its bucket buffers
    # (parallel/overlap.py; with train.overlap_grad_reduce=false it concatenates one bucket at a
    # time, at most min(grad_bytes, bucket), never more than the gather bucket below).
    fp32_grads = 4 * n_local / c.lay.dp if not wide else 0.0
    last = c.lay.pp - 1
    share = c.stage_share or (1.0,)

    def stage_need(i: int, layers: int) -> float:
        """Stage i's gradients (its own parameters') and the larger of its backward's activations
        and its optimizer step's buffers (both its parameters' too)."""
        grads = grad_bytes * share[i]
        gather = (1 + c.lay.dp) * min(grads / c.lay.dp, bucket) if c.lay.dp > 1 else 0.0
        return grads + max(activations(i, layers) + (logits if i == last else 0.0), fp32_grads * share[i], gather)

    stages = tuple(stage_need(i, len(r)) for i, r in enumerate(stage_layers(c.mc.cfg.num_hidden_layers, c.lay.pp)))
    total = (t_mb + dp + opt) * steps
    if shape.recompute_actor and spec.role == "actor" and not spec.value_head:
        # the rollout-mismatch recompute (algo/mismatch.py): one forward over the replica's whole batch,
        # in the train call's micro-batch count (as algo/calls.py actor_train runs it)
        re = _inference(c, spec, shape, min(m, max_micro_batches(replace(spec, kind="inference"), shape, c.lay))).time_s
        acc["recompute"] = re
        total += re
    return Estimate(total, flops, c.stage_param_bytes, state, max(stages), acc, active=busy_share(c, m),
                    stage_transient=stages if c.lay.pp > 1 else (), stage_share=c.stage_share)


def estimate_call(spec: CallSpec, shape: RunShape, layout: Layout, micro_batches: int, hw: Hardware,
                  links: Links = NO_LINKS) -> Estimate:
    """Time and per-device memory of ``spec`` under ``layout`` with ``micro_batches`` per DP rank
    (per mini-batch for train calls). The layout must suit the model (see Layout.check_model)."""
    # torch.compile where the runtime applies it: tp = 1 (tp's all-reduces stay eager), dense layers
    # (parallel/model.py, model/compiled_layers.py); the one-off compile is outside the price
    one = layout.tp == 1
    c = Ctx(model_costs(spec.model, spec.value_head), hw, layout, links,
             train_compiled=one and shape.compile_layers and not spec.model.num_experts,
             gen_compiled=one and shape.compile_gen)
    run = {"generate": generate_turns, "inference": _inference}.get(spec.kind, _train)
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
