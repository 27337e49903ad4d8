"""SFT and preference data as conversations (TRL's conversational formats) through the chat
template: the prompt is transformers' apply_chat_template of the prompt turns with the assistant
header, prompt + response the whole conversation's; SFT and DPO train on them."""

from __future__ import annotations

import json

import pytest
from test_chat_training import ckpt  # noqa: F401 (the fixture: a tiny chat checkpoint)

from meshrl.algo import setup
from meshrl.commands.settings import load_settings
from meshrl.data.dataset_file import read_dataset
from meshrl.errors import UserError
from meshrl.runtime.job import in_process
from meshrl.runtime.plans import resolve_plan

SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "what is 2 + 2 ?"}
GOOD, BAD = {"role": "assistant", "content": "x"}, {"role": "assistant", "content": "hi there"}
SFT = [{"messages": [SYSTEM, USER, GOOD]},  # conversational language modelling
       {"prompt": [USER], "completion": [BAD]},  # conversational prompt-completion
       {"prompt": "hi", "response": "there"}]  # strings: one user turn, one assistant turn
PAIRS = [{"chosen": [USER, GOOD], "rejected": [USER, BAD]},  # implicit prompt
         {"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]}]  # explicit prompt


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _conv(hf, msgs, gen):
    return hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=False)


def _rows(batch, prefix=""):
    ids, mask, resp = batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"], batch[f"{prefix}response_mask"]
    p = ids.shape[1] - resp.shape[1]
    return [(ids[i, :p][mask[i, :p].bool()].tolist(), ids[i, p:][resp[i].bool()].tolist()) for i in range(len(ids))]


def _settings(path, data, *extra):
    return load_settings(None, [f"models.actor.path={path}", "data.chat_template=true", f"data.path={data}",
                                "data.prompt_len=24", "data.gen_len=12", "data.batch_size=2", *extra])


def test_sft_conversations_are_transformers_chat_ids(ckpt, tmp_path):  # noqa: F811
    path, hf, _ = ckpt
    cfg = _settings(path, _jsonl(tmp_path / "sft.jsonl", SFT), "algo=sft")
    rows = _rows(setup.encode_sft_batch(cfg, setup.tokenizer_for(cfg), setup.sft_records(cfg)))
    convs = [[SYSTEM, USER, GOOD], [USER, BAD], [{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "there"}]]
    for (prompt, response), conv in zip(rows, convs, strict=True):
        assert prompt == _conv(hf, conv[:-1], True)
        assert prompt + response == _conv(hf, conv, False)
        assert hf.convert_tokens_to_ids("<|im_end|>") in response  # the reply ends its turn


def test_preference_conversations_split_at_the_shared_turns(ckpt, tmp_path):  # noqa: F811
    path, hf, _ = ckpt
    data = _jsonl(tmp_path / "pairs.jsonl", PAIRS)
    assert read_dataset(data, "pairs")[0] == {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]}
    cfg = _settings(path, data, "algo=dpo")
    batch = setup.encode_pair_batch(cfg, setup.tokenizer_for(cfg), setup.pair_records(cfg))
    for side, reply in (("chosen", GOOD), ("rejected", BAD)):
        for (prompt, response), head in zip(_rows(batch, f"{side}_"), ([USER], [SYSTEM, USER]), strict=True):
            assert prompt == _conv(hf, head, True) and prompt + response == _conv(hf, head + [reply], False)


def test_conversations_need_the_chat_template(ckpt, tmp_path):  # noqa: F811
    path, _, _ = ckpt
    data = _jsonl(tmp_path / "sft.jsonl", SFT)
    cfg = load_settings(None, [f"models.actor.path={path}", f"data.path={data}", "algo=sft"])
    with pytest.raises(UserError, match=r"record 0 holds chat messages: set data.chat_template=true"):
        setup.encode_sft_batch(cfg, setup.tokenizer_for(cfg), setup.sft_records(cfg))


@pytest.mark.parametrize("algo, records", [("sft", SFT[:2]), ("dpo", PAIRS)])
def test_an_iteration_trains_on_conversations(ckpt, tmp_path, algo, records):  # noqa: F811
    path, _, _ = ckpt
    cfg = _settings(path, _jsonl(tmp_path / "d.jsonl", records), f"algo={algo}", "train.iterations=1")
    rec = in_process(cfg, resolve_plan(cfg, "colocated", 1)[0], None)[0]
    loss = next(v for k, v in rec.items() if k.endswith("loss"))
    assert loss == loss and loss > 0  # finite and positive: real tokens were trained on
