"""Evaluation on held-out prompts while training: eval.path, eval.every, eval.samples.

The policy is evaluated before iteration 0 and then every eval.every iterations, always as it
stands at the start of that iteration; the figures join that iteration's metrics record:

    eval/reward    mean reward of the responses (the run's reward functions or rule, no overlong penalty)
    eval/accuracy  fraction of responses that are correct (reward >= eval.correct)
    eval/pass@k    (eval.samples = k > 1) fraction of prompts with at least one correct response of k
    eval/tool_use  (env.fn) fraction of trajectories that called a tool

eval.samples = 1 decodes greedily; k > 1 samples k responses per prompt with the run's sampling
settings, keyed by (seed, prompt, sample) only, so an evaluation is the same under every plan and
two evaluations differ only by the policy.
"""

from __future__ import annotations

import torch

from ..config import Config
from .batch import Batch
from .common import CallContext, key_seed
from .scoring import eval_records, function_scores
from .setup import encode_prompt_batch
from .calls import generate_rows
from .calls import Place
import copy


def evaluates(cfg: Config) -> bool:
    """Whether the run evaluates its policy: with eval.path, or an RL run on the built-in demo (its
    held-out problems, meshrl/data/demo.py)."""
    demo = cfg.data.path is None and cfg.algo not in ("sft", "rm", "dpo")
    return cfg.eval.path is not None or demo


def eval_due(cfg: Config, iteration: int) -> bool:
    """Whether the policy is evaluated at the start of ``iteration``."""
    return evaluates(cfg) and iteration % cfg.eval.every == 0


def eval_batch(cfg: Config, tok) -> Batch:
    """The eval prompts, each repeated eval.samples times (prompt-major), with per-sample seeds."""

    data = encode_prompt_batch(cfg, tok, eval_records(cfg))
    k = cfg.eval.samples
    rows = torch.arange(len(data)).repeat_interleave(k)
    seeds = torch.tensor([key_seed(cfg.train.seed, "eval", int(r), s) for r, s in
                          zip(rows, torch.arange(k).repeat(len(data)).tolist(), strict=True)])
    return Batch(data.select(rows).data).with_(sample_seed=seeds)


def eval_rows(h, part: Batch, ctx: CallContext, place) -> Batch:
    """One replica's rows of the eval batch -> their responses' reward, row_id and sample index
    (``rewards``, ``row_id`` [b]), on every rank of the replica (generation's output is everywhere)."""

    cfg = ctx.cfg
    seqs = generate_rows(h, part, ctx, place, greedy=cfg.eval.samples == 1)
    if cfg.env.fn:  # multi-turn: the environment's reward, and whether a tool was called
        return Batch({"rewards": seqs["env_reward"], "row_id": part["row_id"],
                      "tool_calls": seqs["env_counts"][:, 1]}, part.index)
    seqs = seqs.with_(answer_ids=part["answer_ids"], row_id=part["row_id"])
    no_overlong = _without_overlong(cfg)
    scores = function_scores(seqs, no_overlong, ctx.tokenizer, eval_records(cfg), cfg.eval.path)["scores"]
    return Batch({"rewards": scores, "row_id": part["row_id"]}, part.index)


def eval_metrics(rows: Batch, cfg: Config) -> dict[str, float]:
    """All replicas' eval rows, merged -> eval/reward, eval/accuracy, eval/pass@k (k > 1)."""
    k = cfg.eval.samples
    r = rows["rewards"].float().view(-1, k)
    correct = r >= cfg.eval.correct
    out = {"eval/reward": float(r.mean()), "eval/accuracy": float(correct.float().mean())}
    if k > 1:
        out[f"eval/pass@{k}"] = float(correct.any(-1).float().mean())
    if "tool_calls" in rows:
        out["eval/tool_use"] = float((rows["tool_calls"] > 0).float().mean())
    return out


def evaluate_local(h, cfg: Config, tok, iteration: int) -> dict[str, float]:
    """The whole evaluation on one process's handle (LocalHandle)."""

    batch = eval_batch(cfg, tok)
    return eval_metrics(eval_rows(h, batch, CallContext(cfg, iteration, tok, algo="eval"), Place()), cfg)


def _without_overlong(cfg: Config) -> Config:
    out = copy.copy(cfg)
    out.reward = copy.copy(cfg.reward)
    out.reward.overlong_buffer = 0
    return out
