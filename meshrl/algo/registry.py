"""Where each call's code lives, and what each graph key means as batch tensors: the data contract
of every call in one place (verl style).

A graph key (what the planner sees) names a group of batch tensors (what the code moves):
"""

from __future__ import annotations

from collections.abc import Callable

from .batch import Batch
from .common import CallContext, Role
from .graph import Call
from .offline import SEQ_KEYS, dpo_train_call, ref_pairs_call, rm_train_call, sft_train_call
from .rollout import generate_call, ref_logprobs_call, score_call, values_call
from .updates import actor_train_call, critic_train_call

_PAIR = tuple(f"{s}_{k}" for s in ("chosen", "rejected") for k in SEQ_KEYS)
FIELDS: dict[str, tuple[str, ...]] = {
    "prompts": ("prompt_ids", "prompt_mask", "sample_seed"),
    "answers": ("answer_ids",),
    "seqs": SEQ_KEYS,
    "seqs_greedy": tuple(f"{k}_greedy" for k in SEQ_KEYS),
    "logp_old": ("logp_old",),
    "logp_ref": ("logp_ref",),
    "values": ("values",),
    "scores": ("scores",),
    "scores_greedy": ("scores_greedy",),
    "sft_seqs": SEQ_KEYS,
    "pairs": _PAIR,
    "ref_pair_logps": ("ref_chosen", "ref_rejected"),
    "actor_stats": (), "critic_stats": (), "reward_stats": (),  # metrics, not tensors
}

CallFn = Callable[[Role, Batch, CallContext], "Batch | tuple[Batch, dict[str, float]]"]


def tensor_keys(keys: tuple[str, ...]) -> list[str]:
    """Graph keys -> the batch tensor names they stand for."""
    return [t for k in keys for t in FIELDS[k]]


def _suffixed(batch: Batch, suffix: str) -> Batch:
    return Batch({k + suffix: v for k, v in batch.data.items()}, batch.index)


def _unsuffixed(batch: Batch, suffix: str) -> Batch:
    return Batch({k[:-len(suffix)] if k.endswith(suffix) else k: v for k, v in batch.data.items()}, batch.index)


def _gen_greedy(role: Role, batch: Batch, ctx: CallContext) -> Batch:
    out = generate_call(role, batch, ctx, greedy=True)
    return _suffixed(out.only(list(SEQ_KEYS)), "_greedy")


def _score_greedy(role: Role, batch: Batch, ctx: CallContext) -> Batch:
    return Batch({"scores_greedy": score_call(role, _unsuffixed(batch, "_greedy"), ctx)["scores"]})


def implementation(call: Call, algo: str) -> CallFn:
    """The function that runs ``call`` of ``algo``'s graph."""
    if call.name == "actor_train":
        return {"sft": sft_train_call, "dpo": dpo_train_call}.get(algo, actor_train_call)
    if call.name == "ref_inf":
        return ref_pairs_call if algo == "dpo" else ref_logprobs_call
    table: dict[str, CallFn] = {
        "actor_gen": generate_call, "actor_gen_greedy": _gen_greedy, "reward_inf": score_call,
        "reward_inf_greedy": _score_greedy, "critic_inf": values_call, "critic_train": critic_train_call,
        "reward_train": rm_train_call,
    }
    return table[call.name]
