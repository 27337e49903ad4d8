"""Observations of a multi-turn rollout under data.chat_template: the tokens between two policy
turns are the checkpoint template's next turn as transformers renders it (the oracle), tokenized
by transformers' own tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from test_chat_training import ckpt  # noqa: F401  (the tiny ChatML checkpoint fixture)

from meshrl.algo import setup
from meshrl.algo.calls import Place, generate_rows
from meshrl.algo.common import CallContext
from meshrl.algo.handles import LocalHandle
from meshrl.algo.iteration import rollout_batch
from meshrl.commands.settings import load_settings
from meshrl.model import load_pretrained

ENV = Path(__file__).parents[1] / "algo" / "count_env.py"


def test_observations_are_the_templates_next_turn(ckpt):  # noqa: F811
    path, hf, data = ckpt
    cfg = load_settings(None, ["algo=grpo", f"models.actor.path={path}", "data.chat_template=true", f"data.path={data}",
                             "data.prompt_len=24", "data.gen_len=4", "data.batch_size=2", f"env.fn={ENV}:WordsEnv",
                             "env.max_turns=2", "env.max_tokens=32"])
    tok = setup.tokenizer_for(cfg)
    b = rollout_batch(setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg)), cfg, 0)
    g = generate_rows(LocalHandle(load_pretrained(path)), b, CallContext(cfg, 0, tok), Place())
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "REPLY"},
            {"role": "user", "content": "hi there"}]
    after = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True).split("REPLY", 1)[1]
    end = hf.convert_tokens_to_ids("<|im_end|>")
    p = b["prompt_ids"].shape[1]
    assert torch.all(g["env_counts"][:, 4] == 1)  # one observation each (WordsEnv: two turns)
    for i in range(len(g)):
        ids = g["input_ids"][i, p:].tolist()
        policy, attn = g["response_mask"][i].tolist(), g["attention_mask"][i, p:].tolist()
        first = policy.index(0)  # the first turn's tokens end where the observation starts
        obs = [t for t, m, a in zip(ids, policy, attn, strict=True) if a and not m]
        ended = ids[first - 1] == end
        want = hf.encode(after[len("<|im_end|>"):] if ended else after, add_special_tokens=False)
        assert obs == want
        assert ids[first:first + len(obs)] == obs and all(policy[first + len(obs):first + len(obs) + 1])
