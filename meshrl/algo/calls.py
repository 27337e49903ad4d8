"""The one implementation of every call, on a model handle: batch in, batch out. The multi-rank
engine runs them on the ranks of a layout (ParallelModel), the single-process trainer on one
process (LocalHandle); meshrl/algo/handles.py has the protocol. This file holds the RL calls,
calls_offline.py the SFT / reward-model / DPO ones; ``implementation`` picks a graph call's code.

- inference calls (generate, scores, ref log-probs, values) are row-wise: each data-parallel
  replica gets its token-balanced part (``Batch.split``) and returns its rows with their index, on
  the ranks that hold outputs (last pipeline stage), else None;
- train calls get the whole batch (advantages are whitened / grouped over it), cut it into the
  keyed mini-batches, and give each replica its part of every mini-batch; each loss is divided by
  the token count of the whole mini-batch, so the split changes only the summation order.

Data contracts (keys read -> keys written; shapes as in meshrl/algo/batch.py, P = prompt_len,
N = gen_len):

    actor_gen      prompt_ids, prompt_mask [B, P], sample_seed [B]
                   -> input_ids, attention_mask [B, P+N], response_mask [B, N], logp_old [B, N]
                   (env.fn: + answer_ids, row_id in; + env_reward [B], env_counts [B, 6],
                   env_turn_len [B, env.max_turns] out; N = env.max_tokens; multiturn.py)
    reward_inf     input_ids, attention_mask, response_mask, answer_ids [B, N], row_id [B]
                   -> scores [B], score_parts [B, K] (each reward.fn's value, the overlong penalty;
                   env.fn: the environment's reward, env_reward)
    ref_inf        input_ids, attention_mask, response_mask -> logp_ref [B, N]
    critic_inf     input_ids, attention_mask, response_mask -> values [B, N]
    actor_train    seqs, logp_old, logp_ref, scores (+ values for ppo, + scores_greedy for remax)
                   -> actor/* stats
    critic_train   seqs, logp_old, logp_ref, scores, values -> critic/* stats
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model import worst_case
from ..model.heads import HeadOutputs
from .advantages import last_token_index
from .batch import Batch
from .common import CallContext, StatSum, minibatch_rows
from .filtering import filter_groups
from .graph import Call
from .handles import ModelHandle
from .kl import kl_estimate
from .losses import Norm, aggregate, policy_loss, value_loss
from .mismatch import TrainForwardMismatch, rollout_correction
from .lr_schedule import factor_at, set_lr_factor
from .multiturn import multiturn_rows
from .objectives import critic_free_advantages, kl_settings, ppo_advantages
from .registry import SEQ_KEYS
from .rollout import generation_config, pack_generation
from .scoring import function_scores, train_records, with_overlong
from ..model.numerics import wide


@dataclass
class Place:
    """Where this rank sits in its call: its dp replica, the micro-batches per replica, whether it
    holds outputs (last pipeline stage), and the group over which the replicas' stats are summed."""

    dp_index: int = 0
    dp_size: int = 1
    micro_batches: int = 1
    holds_output: bool = True
    sum_replicas: Callable[[list[float]], list[float]] | None = None


def _prompt_len(batch: Batch) -> int:
    return batch["input_ids"].shape[1] - batch["response_mask"].shape[1]


def generate_rows(h: ModelHandle | None, part: Batch, ctx: CallContext, place: Place, greedy: bool = False
                  ) -> Batch:
    """prompt_ids, prompt_mask [b, P], sample_seed [b] -> input_ids, attention_mask [b, P+N],
    response_mask [b, N], logp_old [b, N]; row i samples from sample_seed[i] only."""
    cfg, tok = ctx.cfg, ctx.tokenizer
    if cfg.env.fn:  # a multi-turn rollout (multiturn.py): one generate call per turn
        return multiturn_rows(h, part, ctx, place.micro_batches, greedy)
    p_ids, p_mask = part["prompt_ids"], part["prompt_mask"]
    prompts = [row[m.bool()].tolist() for row, m in zip(p_ids, p_mask, strict=True)]
    out = h.generate(prompts, generation_config(cfg, tok, greedy), None if greedy else part["sample_seed"].tolist(),
                     place.micro_batches)
    return Batch(pack_generation(out, p_ids, p_mask, cfg.data.gen_len, tok.pad_token_id), part.index)


def score_rows(h: ModelHandle | None, part: Batch, ctx: CallContext, place: Place) -> Batch | None:
    """scores [b], score_parts [b, K]: the rule's or the user functions' verdict (no model), else the
    reward model's value at the last token; plus the overlong penalty (meshrl/algo/scoring.py)."""
    cfg = ctx.cfg
    if cfg.env.fn:  # the environment's reward, summed over the trajectory's steps
        return Batch({"scores": part["env_reward"].float(), "score_parts": torch.zeros(len(part), 0)}, part.index)
    if h is None:
        out = function_scores(part, cfg, ctx.tokenizer, train_records(cfg), cfg.data.path or "the demo prompts")
        return Batch(out, part.index)
    values = h.values(part["input_ids"], part["attention_mask"], place.micro_batches)
    if values is None:
        return None
    last = _prompt_len(part) + last_token_index(part["response_mask"])
    scores = wide(values).gather(1, last[:, None]).squeeze(1)
    return Batch(with_overlong(cfg, scores, torch.zeros(len(scores), 0), part["response_mask"]), part.index)


def ref_logprob_rows(h: ModelHandle, part: Batch, ctx: CallContext, place: Place) -> Batch | None:
    """logp_ref [b, N]: log-probs of the response tokens, 0 on padding."""
    lp = h.logprobs(part["input_ids"], part["attention_mask"], place.micro_batches)
    if lp is None:
        return None
    return Batch({"logp_ref": lp[:, _prompt_len(part) - 1:] * part["response_mask"]}, part.index)


def value_rows(h: ModelHandle, part: Batch, ctx: CallContext, place: Place) -> Batch | None:
    """values [b, N]: V(state before response token t), 0 on padding."""
    v = h.values(part["input_ids"], part["attention_mask"], place.micro_batches)
    if v is None:
        return None
    p = _prompt_len(part)
    return Batch({"values": wide(v[:, p - 1:-1]) * part["response_mask"]}, part.index)


def reduce_stats(stats: StatSum, place: Place) -> dict[str, float]:
    """Sum the replicas' stats (each already divided by the whole mini-batch's count)."""
    names = sorted(stats.sums)
    if place.sum_replicas is not None and names:
        sums = place.sum_replicas([stats.sums[n] for n in names])  # float64: control plane
        return dict(zip(names, sums, strict=True))
    return dict(stats.sums)


def _minibatches(data: Batch, ctx: CallContext, place: Place):
    """(replica part as a dict of tensors, its micro-batch count, the whole mini-batch's counts) of
    each keyed mini-batch."""
    cfg = ctx.cfg
    keys = [(epoch, rows) for epoch in range(cfg.ppo.epochs)
            for rows in minibatch_rows(len(data), cfg.ppo.mini_batches, cfg.train.seed, ctx.iteration, epoch)]
    for i in worst_case.repeated_steps(len(keys)):  # every step, except in a dry run (model/worst_case.py)
        mb = data.select(keys[i][1])
        norm = Norm(tokens=float(mb["response_mask"].sum().clamp(min=1)), seqs=float(len(mb)),
                    width=float(mb["response_mask"].shape[1]))
        part = mb.split(place.dp_size)[place.dp_index] if place.dp_size > 1 else mb
        yield dict(part.data), min(place.micro_batches, len(part)), norm


def scheduled_step(h: ModelHandle, ctx: CallContext, k: int) -> float:
    """Set the LR of the iteration's k-th optimizer step (optim.schedule; the main stage only, not
    the demo's SFT warm-up, whose context names another algorithm) and return it."""
    factor = factor_at(ctx.cfg, ctx.iteration, k) if ctx.algo == ctx.cfg.algo else 1.0
    return set_lr_factor(h, factor)


def actor_train(h: ModelHandle, batch: Batch, ctx: CallContext, place: Place) -> dict[str, float]:
    """PPO-clip updates of the actor (ppo.epochs x ppo.mini_batches steps) on the iteration's batch
    (its informative groups under data.filter_groups); -> actor/* stats, optim/lr (the LR of the
    iteration's first step), batch/* (filter_groups)."""
    cfg = ctx.cfg
    batch, extra = filter_groups(batch, cfg)
    adv = ppo_advantages(batch, cfg)[0] if ctx.algo == "ppo" else critic_free_advantages(batch, cfg, ctx.algo)
    mode, est = kl_settings(cfg, ctx.algo)
    keys = ["input_ids", "attention_mask", "response_mask", "logp_old", "logp_ref"]
    data = Batch({k: batch[k] for k in keys}).with_(advantages=adv)
    seen = None  # the mismatch from the first mini-batch's forward where nothing needs the recompute
    if cfg.trainer_logprobs_needed():
        data, mismatch = rollout_correction(h, data, cfg, place.dp_index, place.dp_size, place.micro_batches,
                                            place.sum_replicas)  # before any update: the trainer's log-probs
        extra.update(mismatch)
    else:
        seen = TrainForwardMismatch()
    stats, steps = StatSum(), 0
    for part, micro, norm in _minibatches(data, ctx, place):
        lr = scheduled_step(h, ctx, steps)
        extra.setdefault("optim/lr", lr)
        h.forward_backward(part, _actor_loss_fn(cfg, mode, est, norm, stats, seen if steps == 0 else None), micro,
                           entropy=cfg.ppo.entropy_coef != 0.0, moe_aux=cfg.ppo.moe_aux_coef / norm.seqs)
        stats.add("grad_norm", h.optimizer_step() / (place.dp_size if place.holds_output else 1))
        steps += 1
    sums = reduce_stats(stats, place) if place.holds_output else {}
    if seen is not None and place.holds_output:
        extra.update(seen.metrics(place.dp_index, place.dp_size, place.sum_replicas))
    return {**{f"actor/{k}": v / steps for k, v in sums.items()}, **(extra if place.holds_output else {})}


def _actor_loss_fn(cfg, mode: str, est: str, norm: Norm, stats: StatSum, seen: TrainForwardMismatch | None = None
                   ) -> Callable[[HeadOutputs, dict], torch.Tensor]:
    """The policy loss of a micro-batch (ppo.clip / clip_high / dual_clip / ratio), with the KL loss
    and the entropy bonus, all aggregated by ppo.loss_agg over the whole mini-batch (``norm``)."""
    o, agg = cfg.ppo, cfg.ppo.loss_agg

    def loss_fn(out: HeadOutputs, mb: dict) -> torch.Tensor:
        mask = mb["response_mask"].float()
        p = mb["input_ids"].shape[1] - mask.shape[1]
        logp = out.logprobs[:, p - 1:]
        if seen is not None:
            seen.add(logp, mb["logp_old"], mask)
        loss, st = policy_loss(logp, mb["logp_old"], mb["advantages"], mask, o.clip, norm, clip_high=o.clip_high,
                               dual_clip=o.dual_clip, ratio=o.ratio, agg=agg, weights=mb.get("is_weight"))
        stats.add("pg_loss", loss.detach())
        for k, v in st.items():
            stats.add(k, v)
        if mode == "loss" and cfg.ppo.kl_coef != 0.0:
            kl = aggregate(kl_estimate(logp, mb["logp_ref"], est), mask, norm, agg)
            stats.add("kl_loss", kl.detach())
            loss = loss + cfg.ppo.kl_coef * kl
        if cfg.ppo.entropy_coef != 0.0:
            ent = aggregate(out.entropy[:, p - 1:], mask, norm, agg)
            stats.add("entropy", ent.detach())
            loss = loss - cfg.ppo.entropy_coef * ent
        return loss

    return loss_fn


def critic_train(h: ModelHandle, batch: Batch, ctx: CallContext, place: Place) -> dict[str, float]:
    """Clipped value regression on the GAE returns, same batch and mini-batches as the actor (token-
    mean, as verl's value loss); -> critic/*, optim/critic_lr."""
    cfg = ctx.cfg
    batch, _ = filter_groups(batch, cfg)
    _, returns = ppo_advantages(batch, cfg)
    keys = ["input_ids", "attention_mask", "response_mask", "values"]
    data = Batch({k: batch[k] for k in keys}).with_(returns=returns)
    stats, steps = StatSum(), 0

    def make_loss(norm: Norm) -> Callable[[HeadOutputs, dict], torch.Tensor]:
        def loss_fn(out: HeadOutputs, mb: dict) -> torch.Tensor:
            mask = mb["response_mask"].float()
            p = mb["input_ids"].shape[1] - mask.shape[1]
            v = wide(out.values[:, p - 1:-1]) * mask
            loss, st = value_loss(v, mb["values"], mb["returns"], mask, cfg.ppo.value_clip, norm.tokens)
            stats.add("vf_loss", loss.detach())
            stats.add("vf_clipfrac", st["clipfrac"])
            return loss
        return loss_fn

    first_lr = None
    for part, micro, norm in _minibatches(data, ctx, place):
        lr = scheduled_step(h, ctx, steps)
        first_lr = lr if first_lr is None else first_lr
        h.forward_backward(part, make_loss(norm), micro)
        stats.add("grad_norm", h.optimizer_step() / (place.dp_size if place.holds_output else 1))
        steps += 1
    if not place.holds_output:
        return {}
    return {**{f"critic/{k}": v / steps for k, v in reduce_stats(stats, place).items()}, "optim/critic_lr": first_lr}


def _suffixed(b: Batch, suffix: str) -> Batch:
    return Batch({k + suffix: v for k, v in b.data.items()}, b.index)


def _gen_greedy(h, part: Batch, ctx: CallContext, place: Place) -> Batch:
    out = generate_rows(h, part, ctx, place, greedy=True)
    return _suffixed(out.only(list(SEQ_KEYS)), "_greedy")


def _score_greedy(h, part: Batch, ctx: CallContext, place: Place) -> Batch | None:
    unsuffixed = Batch({k.removesuffix("_greedy"): v for k, v in part.data.items()}, part.index)
    out = score_rows(h, unsuffixed, ctx, place)
    return None if out is None else Batch({"scores_greedy": out["scores"]}, part.index)


ROW_CALLS = {"actor_gen": generate_rows, "actor_gen_greedy": _gen_greedy, "reward_inf": score_rows,
             "reward_inf_greedy": _score_greedy, "ref_inf": ref_logprob_rows, "critic_inf": value_rows}
TRAIN_CALLS = {"actor_train": actor_train, "critic_train": critic_train}


def row_wise(call: Call) -> bool:
    """Whether the call maps rows to rows (each dp replica runs its part of the batch), rather than
    training on the whole batch."""
    return call.kind != "train"
