"""The built-in demo's evaluations (eval.path ones are meshrl/algo/evaluate.py's), reported besides
the calls' statistics, written against a model handle like the
calls: the rule reward of a sampled answer (sft and dpo on the demo) and the reward model's accuracy
on held-out pairs (rm on the demo).

The runtime runs each one at the end of the iterations it is due, on its role's home placement:
every data-parallel replica takes its part of the rows (``Batch.split``) and the rank that holds the
replica's outputs returns the part's sum divided by the number of rows of the whole evaluation, so
the replicas' figures add up to the mean whatever the split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from . import setup
from .batch import Batch
from .calls import Place, generate_rows, score_rows
from .common import CallContext
from .iteration import rollout_batch
from .registry import side


@dataclass
class Evaluation:
    """``metric`` = the mean of ``fn`` over ``rows(t)``, on ``role``'s model, when ``due(t)``.
    ``fn(handle, part, ctx, place)`` -> the sum over the part's rows (outputs' holders), else None."""

    metric: str
    role: str
    rows: Callable[[int], Batch]
    fn: Callable[..., float | None]
    due: Callable[[int], bool]
    algo: str = ""  # the context's algorithm ("" = the run's)


def sampled_reward(h, part: Batch, ctx: CallContext, place: Place) -> float | None:
    """Sum of the rule's verdicts on one sampled answer per row (every rank of the replica generates)."""
    seqs = generate_rows(h, part, ctx, place)
    if not place.holds_output:
        return None
    scored = score_rows(None, seqs.with_(answer_ids=part["answer_ids"], row_id=part["row_id"]), ctx, place)
    return float(scored["scores"].sum())


def pairs_ranked_right(h, part: Batch, ctx: CallContext, place: Place) -> float | None:
    """How many pairs the reward model scores chosen above rejected."""
    chosen = score_rows(h, side(part, "chosen_"), ctx, place)
    rejected = score_rows(h, side(part, "rejected_"), ctx, place)
    if chosen is None:
        return None
    return float((chosen["scores"] > rejected["scores"]).sum())


def evaluations(cfg: Config, tok) -> list[Evaluation]:
    """The run's evaluations (the demo's: a user's JSONL data has no rule answers or held-out pairs)."""
    if cfg.data.path is not None:  # the demo's own evaluations; a user's data has eval.path (evaluate.py)
        return []
    if cfg.algo in ("sft", "dpo"):
        prompts = setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg))
        return [Evaluation("reward/mean", "actor", lambda t: rollout_batch(prompts, cfg, t), sampled_reward,
                           lambda t: True, algo="ppo")]
    if cfg.algo == "rm":
        heldout = setup.encode_pair_batch(cfg, tok, setup.pair_records(cfg, heldout=True))
        last = cfg.train.iterations - 1
        return [Evaluation("rm/heldout_accuracy", "reward", lambda t: heldout, pairs_ranked_right,
                           lambda t: t % 10 == 0 or t == last)]
    return []
