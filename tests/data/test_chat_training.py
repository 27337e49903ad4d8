"""data.chat_template=true in a run: prompts are the checkpoint template's rendering, token for
token what transformers' apply_chat_template gives; generation stops at the end-of-turn token;
a GRPO iteration runs on {"messages": [...]} records."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from test_chat import CHATML, _tokenizer_dir

from meshrl.algo import setup
from meshrl.algo.rollout import stop_token_id
from meshrl.runtime.job import in_process
from meshrl.runtime.plans import resolve_plan
from meshrl.commands.settings import load_settings
from meshrl.errors import UserError

RECORDS = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2 + 2 ?"}],
            "answer": "x"},
           {"prompt": "hi there", "answer": "hi"}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny random llama checkpoint with a ChatML template and its tokenizer."""
    path = _tokenizer_dir(tmp_path_factory.mktemp("chat") / "ckpt", CHATML, as_file=False)
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(hf), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    data = path.parent / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path, hf, data


def test_prompts_are_transformers_chat_ids_and_generation_stops_at_end_of_turn(ckpt):
    path, hf, data = ckpt
    cfg = load_settings(None, [f"models.actor.path={path}", "data.chat_template=true", f"data.path={data}",
                             "data.prompt_len=24"])
    tok = setup.tokenizer_for(cfg)
    batch = setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg))
    for i, rec in enumerate(RECORDS):
        msgs = rec.get("messages") or [{"role": "user", "content": rec["prompt"]}]
        text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        want = hf.encode(text, add_special_tokens=False)
        got = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        assert got == want
    assert stop_token_id(cfg, tok) == hf.convert_tokens_to_ids("<|im_end|>") != tok.eos_token_id


def test_a_grpo_iteration_on_chat_records(ckpt):
    path, _, data = ckpt
    cfg = load_settings(None, ["algo=grpo", f"models.actor.path={path}", "data.chat_template=true", f"data.path={data}",
                             "data.prompt_len=24", "data.gen_len=4", "data.batch_size=2", "train.iterations=1"])
    rec = in_process(cfg, resolve_plan(cfg, "colocated", 1)[0], None)[0]
    assert 0.0 <= rec["reward/mean"] <= 1.0 and rec["response/length"] > 0


def test_messages_without_chat_template_are_refused(ckpt):
    path, _, data = ckpt
    cfg = load_settings(None, [f"models.actor.path={path}", f"data.path={data}", "data.prompt_len=24"])
    with pytest.raises(UserError, match="data.chat_template=true"):
        setup.encode_prompt_batch(cfg, setup.tokenizer_for(cfg), setup.prompt_records(cfg))
