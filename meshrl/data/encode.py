"""Records (strings) to the fixed-width tensors of algo/batch.py.

Prompts are encoded as the tokenizer does (``prompt_ids``: BOS where it adds one), left-padded to
P = data.prompt_len; responses are ``tokens + [eos]``
right-padded to N = data.gen_len. Too-long text is a UserError naming the record, never a silent
truncation (a truncated answer would silently change the task).
"""

from __future__ import annotations

import torch

from ..errors import UserError
from ..model.tokenizer import ByteTokenizer


def _plain(tok, text: str) -> list[int]:
    """Tokens of ``text`` with no special tokens added."""
    if isinstance(tok, ByteTokenizer):
        return tok.encode(text)
    return tok.encode(text, add_special_tokens=False)


def plain_ids(tok, text: str) -> list[int]:
    """Tokens of ``text`` with no special tokens added (text that carries its own, e.g. a rendered
    chat-template turn)."""
    return _plain(tok, text)


def prompt_ids(tok, text: str, special_tokens: bool = True) -> list[int]:
    """A prompt's ids, the one encoding that training, evaluation and ``meshrl generate`` share:
    the tokenizer's own special tokens, as transformers encodes (a Hugging Face tokenizer's
    post-processor adds BOS where the model was trained with it, and nothing where not; the byte
    tokenizer's convention is BOS first). ``special_tokens=False``: text that carries its own,
    such as a rendered chat template."""
    if isinstance(tok, ByteTokenizer):
        return tok.encode(text, add_bos=special_tokens)
    return tok.encode(text, add_special_tokens=special_tokens)


def encode_prompt(tok, text: str, prompt_len: int, where: str, chat: bool = False) -> list[int]:
    """The prompt's ids (``prompt_ids``; ``chat``: a rendered template's, no special token added),
    checked against P."""
    return _checked(_plain(tok, text) if chat else prompt_ids(tok, text), prompt_len, where, "prompt",
                    "data.prompt_len")


def encode_response(tok, text: str, gen_len: int, where: str, chat: bool = False) -> list[int]:
    """The response's ids + EOS (``chat``: a rendered template's, which ends its own turn), checked
    against N."""
    eos = [tok.eos_token_id] if tok.eos_token_id is not None and not chat else []
    return _checked(_plain(tok, text) + eos, gen_len, where, "response", "data.gen_len")


def _checked(ids: list[int], width: int, where: str, what: str, key: str) -> list[int]:
    if len(ids) > width:
        raise UserError(f"{where}: {what} is {len(ids)} tokens, more than {key}={width}")
    return ids


def left_pad(rows: list[list[int]], width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids, mask [B, width], real tokens at the right end."""
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
    return ids, mask


def right_pad(rows: list[list[int]], width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids, mask [B, width], real tokens at the left end."""
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def encode_prompts(tok, records: list[dict], prompt_len: int, answer_len: int, template=None
                   ) -> dict[str, torch.Tensor]:
    """Prompt records -> prompt_ids, prompt_mask [B, P]; answer_ids [B, answer_len] (tokens of the
    answer, pad-filled; all pad when a record has none, or one longer than answer_len); row_id [B]
    (the record's index, for reward functions that read the record). ``template`` (a
    data.chat.ChatTemplate): each record is rendered through it ({"messages"} or {"prompt"}) and
    encoded as is (the template writes any BOS)."""
    pad = tok.pad_token_id
    prompts = []
    for i, r in enumerate(records):
        if template is None:
            prompts.append(encode_prompt(tok, r["prompt"], prompt_len, f"prompt {i}"))
            continue
        ids = _plain(tok, template.render(r))
        if len(ids) > prompt_len:
            raise UserError(f"prompt {i}: rendered through the chat template it is {len(ids)} tokens, more than "
                            f"data.prompt_len={prompt_len}")
        prompts.append(ids)
    # Rewards read each record's own answer text (algo/scoring.py, by row_id); answer_ids carries it
    # as tokens where it fits in data.gen_len, and is all pad for a longer one (a whole GSM8K or MATH
    # solution, whose final answer the rule extracts from the text).
    answers = [a if len(a := _plain(tok, r.get("answer", ""))) <= answer_len else [] for r in records]
    p_ids, p_mask = left_pad(prompts, prompt_len, pad)
    a_ids, _ = right_pad(answers, answer_len, pad)
    return {"prompt_ids": p_ids, "prompt_mask": p_mask, "answer_ids": a_ids,
            "row_id": torch.arange(len(records), dtype=torch.long)}


def encode_sequences(tok, prompts: list[str], responses: list[str], prompt_len: int, gen_len: int,
                     chat: bool = False) -> dict[str, torch.Tensor]:
    """(prompt, response) strings -> input_ids, attention_mask [B, P+N], response_mask [B, N].
    ``chat``: texts rendered through a chat template (data/chat_records.py), which carry their own
    special tokens: none is added, the response's end of turn is its last token instead of EOS."""
    pad = tok.pad_token_id
    p = [encode_prompt(tok, t, prompt_len, f"record {i}", chat) for i, t in enumerate(prompts)]
    r = [encode_response(tok, t, gen_len, f"record {i}", chat) for i, t in enumerate(responses)]
    p_ids, p_mask = left_pad(p, prompt_len, pad)
    r_ids, r_mask = right_pad(r, gen_len, pad)
    return {"input_ids": torch.cat([p_ids, r_ids], 1), "attention_mask": torch.cat([p_mask, r_mask], 1),
            "response_mask": r_mask}
