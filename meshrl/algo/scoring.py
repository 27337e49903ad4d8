"""The reward of each response, from the run's sources: the rule or the user's functions
(user_rewards.py), or a reward model's score, plus DAPO's overlong penalty. Pure functions of the
rows and the dataset records; meshrl's reward call (``score_rows``) and evaluation use them.

Each scored row carries ``row_id``, its record's index in the dataset, so that a user function
gets the record's own prompt, answer and other fields (``**row``).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..config import Config
from .batch import Batch
from .rollout import decode_responses
from .user_rewards import overlong_penalty, score_texts
from ..data import demo
from ..data.dataset_file import read_dataset


@lru_cache(maxsize=4)
def _records(path: str | None, renames: tuple = ()) -> tuple:
    return tuple(read_dataset(path, "prompts", renames) if path else demo.prompts())


def train_records(cfg: Config) -> list[dict]:
    """The prompt records the run draws from (data.path, else the demo's), read once per process."""
    return list(_records(cfg.data.path if cfg.algo not in ("sft", "rm", "dpo") else None, cfg.data.renames()))


def eval_records(cfg: Config) -> list[dict]:
    """The held-out prompt records: eval.path's, else (the demo) its held-out problems."""
    if cfg.eval.path is None:
        return demo.prompts("heldout")
    return list(_records(cfg.eval.path, cfg.data.renames()))


def _prompt_text(part: Batch, i: int, tok) -> str:
    p = part["input_ids"].shape[1] - part["response_mask"].shape[1]
    ids, mask = part["input_ids"][i, :p], part["attention_mask"][i, :p]
    return tok.decode([t for t, m in zip(ids.tolist(), mask.tolist(), strict=True) if m])


def function_scores(part: Batch, cfg: Config, tok, records: list[dict] | None, source: str
                    ) -> dict[str, torch.Tensor]:
    """Rows input_ids, attention_mask, response_mask, answer_ids, row_id -> scores [b] (the
    weighted sum of the functions + overlong) and score_parts [b, K] (see user_rewards.part_names).
    ``records`` the dataset ``row_id`` indexes (``source`` names it in errors)."""
    responses = decode_responses(part, tok)
    prompts, answers, rows, where = [], [], [], []
    for i in range(len(responses)):
        rid = int(part["row_id"][i]) if "row_id" in part else -1
        rec = records[rid] if records is not None and 0 <= rid < len(records) else {}
        prompts.append(str(rec["prompt"]) if "prompt" in rec else _prompt_text(part, i, tok))
        answers.append(str(rec["answer"]) if "answer" in rec else tok.decode(part["answer_ids"][i].tolist()))
        rows.append({k: v for k, v in rec.items() if k not in ("prompt", "answer")})
        where.append(f"dataset row {rid} of {source}" if rid >= 0 else f"row {i}")
    score, vals = score_texts(cfg, prompts, responses, answers, rows, where)
    parts = vals if cfg.reward.fn else torch.zeros(len(responses), 0)
    return with_overlong(cfg, score, parts, part["response_mask"])


def with_overlong(cfg: Config, scores: torch.Tensor, parts: torch.Tensor, response_mask: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """scores [b] (+ the overlong penalty when reward.overlong_buffer > 0, also a column of parts)."""
    r = cfg.reward
    if r.overlong_buffer > 0:
        pen = overlong_penalty(response_mask.sum(-1), cfg.data.gen_len, r.overlong_buffer, r.overlong_penalty)
        scores, parts = scores + pen, torch.cat([parts, pen[:, None]], 1)
    return {"scores": scores.float(), "score_parts": parts.float()}
