"""What each graph key means as batch tensors: the data contract of every call in one place (verl
style). A graph key (what the planner sees) names a group of batch tensors (what the code moves).
The calls' code is meshrl/algo/calls.py and calls_offline.py (``implementation``)."""

from __future__ import annotations

from .batch import Batch

SEQ_KEYS = ("input_ids", "attention_mask", "response_mask")
PAIR_KEYS = tuple(f"{s}_{k}" for s in ("chosen", "rejected") for k in SEQ_KEYS)
FIELDS: dict[str, tuple[str, ...]] = {
    "prompts": ("prompt_ids", "prompt_mask", "sample_seed"),
    "answers": ("answer_ids", "row_id"),
    "seqs": SEQ_KEYS,
    "seqs_greedy": tuple(f"{k}_greedy" for k in SEQ_KEYS),
    "logp_old": ("logp_old",),
    "logp_ref": ("logp_ref",),
    "values": ("values",),
    "scores": ("scores", "score_parts"),
    "scores_greedy": ("scores_greedy",),
    "env": ("env_reward", "env_counts", "env_turn_len"),  # multi-turn rollouts (multiturn.py)
    "sft_seqs": SEQ_KEYS,
    "pairs": PAIR_KEYS,
    "ref_pair_logps": ("ref_chosen", "ref_rejected"),
    "actor_stats": (), "critic_stats": (), "reward_stats": (),  # metrics, not tensors
}


def tensor_keys(keys: tuple[str, ...]) -> list[str]:
    """Graph keys -> the batch tensor names they stand for."""
    return [t for k in keys for t in FIELDS[k]]


def side(batch: Batch, prefix: str) -> Batch:
    """The chosen_ or rejected_ half of a pair batch, under the plain sequence key names."""
    return Batch({k: batch[prefix + k] for k in SEQ_KEYS}, batch.index)
