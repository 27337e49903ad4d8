"""The estimator's price of a generation call (plan/estimator.py): prefill, then decoding rounds
integrated over the context length, with pp > 1 the plan's micro-batches in flight through the
stages (as parallel/generate.py and generate_micro.py run it), and multi-turn rollouts as one
generation per turn. Pure Python."""

from __future__ import annotations

import math

from .. import cpu_features
from ..layout.mesh import Layout
from .call_spec import CallSpec, Estimate, RunShape
from .estimate_steps import Ctx, add_parts, forward_step, measured_time, pipeline_time

LOGIT_BYTES = 4  # logits are kept in fp32 for the softmax / log-probs
DECODE_POINTS = 8  # decoding time is integrated over the context length at this many midpoints


def decode_step(c: Ctx, b: int, ctx: int, head: bool = True) -> tuple[float, dict]:
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
        compute = (c.stage_layers * measured_time(fits.decode, b, mc.layer_active_params / fits.layer_params, c.lay.tp)
                   * c.speed("decode"))
        if head:
            compute += measured_time(fits.fixed_decode, b, mc.head_params / fits.head_params, c.lay.tp)
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


def token_pass(c: Ctx, b: float, ctx: int, m: int) -> tuple[float, dict]:
    """One decoding step of one micro-batch of ``b`` rows through every stage and back: pp - 1
    stages hand their output on, the last one picks the token, which comes back to the others."""
    t, parts = decode_step(c, b, ctx, head=True)
    if c.lay.pp > 1:
        mid, mid_parts = decode_step(c, b, ctx, head=False)
        t += (c.lay.pp - 1) * mid
        add_parts(parts, mid_parts, c.lay.pp - 1)
        hops = return_hops(c, b, m)
        t += hops
        parts["pp_comm"] += hops
    return t, parts


def decode_round(c: Ctx, b: float, m: int, ctx: int) -> tuple[float, dict, float]:
    """One decoding step of the whole batch, ``m`` micro-batches of ``b`` rows in flight
    (parallel/generate_micro.py): the last stage (the slowest: it holds the head) works m steps a
    round, and no micro-batch's next step can start before its tokens are back, so the round
    takes the longer of the two. -> (seconds, breakdown, busy stage-seconds of the round)."""
    trip, parts = token_pass(c, b, ctx, m)
    last, last_parts = decode_step(c, b, ctx, head=True)
    hops = return_hops(c, b, m) if c.lay.pp > 1 else 0.0
    busy = m * (trip - hops)  # every micro-batch's stage steps, over all stages
    if m * last > trip:
        parts = {k: v * m for k, v in last_parts.items()}
        return m * last, parts, busy
    return trip, parts, busy


def return_hops(c: Ctx, b: int, m: int) -> float:
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


def prefill_rows(spec: CallSpec, shape: RunShape, rows: int, mb: int) -> int:
    """Rows a replica's prefill computes: each distinct prompt once (model/generation.PromptBatch),
    the n samples of a prompt being n consecutive rows of the batch (algo/iteration.py), when the
    batch is one micro-batch; with micro-batches in flight, every row. A prefix shared by different
    prompts (a system prompt) is the data's: not priced."""
    n = spec.n_samples if spec.n_samples > 1 else shape.samples_per_prompt
    return max(1, math.ceil(rows / n)) if mb == 1 and n > 1 else rows


def generate(c: Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    """As the runtime generates a replica's prompts (parallel/generate.py): with pp > 1 in
    ``gen_micro_batches`` micro-batches in flight (1: the stages in turn), prefills pipelined as
    an inference call's forwards, then decoding rounds of the whole batch (``decode_round``)."""
    b = s_dp = math.ceil(spec.sequences(shape) / c.lay.dp)
    mb = gen_micro_batches(c.lay, m, b)
    bm = math.ceil(b / mb)
    acc: dict[str, float] = {}
    step, parts = forward_step(c, prefill_rows(spec, shape, bm, mb), shape.prompt_len, shape.prompt_len, prefill=True)
    busy = mb * c.lay.pp * step
    if c.lay.pp == 1:
        t = step
        add_parts(acc, parts, 1)
    else:
        t = pipeline_time(c, mb, step, parts, acc)  # (the head's share over-counted on the other stages: small)
        hops = return_hops(c, bm, mb)  # the first tokens' way back
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
        step, parts, busy_round = decode_round(c, alive, mb, ctx)
        t += per_pt * step
        busy += per_pt * busy_round
        add_parts(acc, parts, per_pt)
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
    prefill_act = bm * shape.prompt_len * mc.infer_bytes_per_token(c.lay.tp, c.hw.dtype_bytes, cpu=c.hw.cpu,
                                                                   keys=shape.prompt_len)
    # the weight copies a CPU's decoding makes once per generation (model/decode_weights.py): eager
    # float32, and bf16 where the CPU has bf16 dot products, pack every projection and the LM head
    # for oneDNN; other bf16 decoding fuses q|k|v and gate|up
    packs = c.hw.dtype_bytes == 4 or (c.hw.dtype_bytes == 2 and cpu_features.native_bf16())
    if c.hw.cpu and packs and not c.gen_compiled and not shape.engine_copy:
        prefill_act += mc.fused_decode_bytes(c.lay.pp, c.lay.tp, c.hw.dtype_bytes, packed=True)
    elif c.hw.cpu and c.hw.dtype_bytes == 2:
        prefill_act += mc.fused_decode_bytes(c.lay.pp, c.lay.tp, c.hw.dtype_bytes)
    # the share of the stages computing at once: their busy seconds over pp x the call's
    active = min(1.0, busy / (c.lay.pp * t)) if t > 0 else 1.0
    return Estimate(t, flops, c.stage_param_bytes, 0.0, kv + logits + prefill_act, acc, active=active,
                    stage_share=c.stage_share)


def generate_turns(c: Ctx, spec: CallSpec, shape: RunShape, m: int) -> Estimate:
    """A generation call: one turn (``generate``), or a multi-turn rollout (env.fn) as the runtime
    runs it (algo/multiturn.py): one generation per turn over the whole batch, each prefilling
    the conversation so far (RunShape.turn_shapes); time and FLOPs add up, memory is the largest
    turn's (each turn's caches are freed before the next)."""
    turns = shape.turn_shapes()
    if len(turns) == 1 and turns[0][1] is shape:
        return generate(c, spec, shape, m)
    parts = [(w, generate(c, spec, s, m)) for w, s in turns]
    acc: dict[str, float] = {}
    for w, e in parts:
        add_parts(acc, e.breakdown, w)
    t = sum(w * e.time_s for w, e in parts)
    peak = max((e for _, e in parts), key=lambda e: e.transient_bytes)
    active = sum(w * e.time_s * e.active for w, e in parts) / t if t > 0 else 1.0
    return Estimate(t, sum(w * e.flops for w, e in parts), peak.weights_bytes, 0.0, peak.transient_bytes, acc,
                    active=active, stage_share=peak.stage_share)
