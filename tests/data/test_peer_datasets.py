"""Datasets in the peers' formats train unchanged: verl's Parquet files (the prompt a list of
messages, the answer in reward_model.ground_truth), TRL's conversational and prompt-completion
JSONL; their rows reach reward functions whole."""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_chat_training import ckpt  # noqa: F401 (the fixture: a tiny chat checkpoint)

from meshrl.algo import setup
from meshrl.algo.scoring import function_scores
from meshrl.commands.settings import load_settings
from meshrl.data.dataset_file import read_dataset
from meshrl.errors import UserError
from meshrl.runtime.job import in_process
from meshrl.runtime.plans import resolve_plan

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
VERL_ROWS = [  # as verl's examples/data_preprocess/gsm8k.py writes them
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": QUESTION}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "7"}, "extra_info": {"split": "train", "index": 0}},
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 5 + 5?"}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "10"}, "extra_info": {"split": "train", "index": 1}},
]


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_parquet_rows_become_chat_records_with_answers(tmp_path):
    recs = read_dataset(write_parquet(tmp_path / "train.parquet", VERL_ROWS), "prompts")
    assert recs[0]["messages"] == [{"role": "user", "content": QUESTION}] and "prompt" not in recs[0]
    assert [r["answer"] for r in recs] == ["7", "10"]
    assert recs[1]["data_source"] == "openai/gsm8k" and recs[1]["extra_info"] == {"split": "train", "index": 1}


def test_trl_formats_map_onto_meshrl_records(tmp_path):
    conv = tmp_path / "conv.jsonl"
    conv.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "solution": "\\boxed{2}"}) + "\n")
    assert read_dataset(conv, "prompts") == [{"messages": [{"role": "user", "content": "hi"}],
                                              "answer": "\\boxed{2}", "solution": "\\boxed{2}"}]
    own = tmp_path / "own.jsonl"  # a record's own answer wins over the peers' names
    own.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "label": "3"}) + "\n")
    assert read_dataset(own, "prompts")[0]["answer"] == "2"
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    assert read_dataset(sft, "sft") == [{"prompt": "a", "response": "b"}]


def test_gsm8k_and_math_files_as_published(tmp_path):
    gsm = tmp_path / "gsm8k.jsonl"
    gsm.write_text(json.dumps({"question": QUESTION, "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}) + "\n")
    rec = read_dataset(gsm, "prompts")[0]
    assert rec["prompt"] == QUESTION and rec["answer"].endswith("#### 7") and rec["question"] == QUESTION
    math = tmp_path / "math.jsonl"
    math.write_text(json.dumps({"problem": "What is $1/2$?", "solution": "It is $\\boxed{\\frac{1}{2}}$."}) + "\n")
    rec = read_dataset(math, "prompts")[0]
    assert rec["prompt"] == "What is $1/2$?" and rec["answer"] == "It is $\\boxed{\\frac{1}{2}}$."


def test_an_answer_longer_than_gen_len_is_scored_from_its_text(tmp_path):
    """A whole GSM8K solution as the answer: more tokens than data.gen_len, yet the rule reads it."""
    sol = "3 + 4 = <<3+4=7>>7 apples in all, as he had 3 and bought 4.\n#### 7"
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "3+4=", "answer": sol}) + "\n")
    cfg = load_settings(None, ["algo=grpo", f"data.path={data}", "data.gen_len=8", "reward.rule=gsm8k"])
    tok = setup.tokenizer_for(cfg)
    records = setup.prompt_records(cfg)
    batch = setup.encode_prompt_batch(cfg, tok, records)
    pad = tok.pad_token_id
    assert len(tok.encode(sol)) > 8 and int(batch["answer_ids"].ne(pad).sum()) == 0
    for response, want in (("#### 7", 1.0), ("#### 8", 0.0)):
        ids = tok.encode(response)[-8:]
        r = torch.tensor([ids + [pad] * (8 - len(ids))])
        part = batch.with_(input_ids=torch.cat([batch["prompt_ids"], r], 1),
                           attention_mask=torch.cat([batch["prompt_mask"], r.ne(pad).long()], 1),
                           response_mask=r.ne(pad).long())
        assert function_scores(part, cfg, tok, records, str(data))["scores"].tolist() == [want]


def test_parquet_errors_name_the_file_and_row(tmp_path, monkeypatch):
    bad = write_parquet(tmp_path / "bad.parquet", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}])
    with pytest.raises(UserError, match=r"bad.parquet:row 2: key 'answer' must be a string"):
        read_dataset(bad, "prompts")
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet\n")
    with pytest.raises(UserError, match="not a readable Parquet file"):
        read_dataset(junk, "prompts")
    with pytest.raises(UserError, match="not found"):
        read_dataset(tmp_path / "none.parquet", "prompts")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as where pyarrow is not installed
    with pytest.raises(UserError, match=r"needs pyarrow: pip install pyarrow"):
        read_dataset(bad, "prompts")


def test_a_grpo_iteration_on_a_verl_parquet_file_scores_with_gsm8k_and_verl_functions(ckpt, tmp_path):  # noqa: F811
    path, hf, _ = ckpt
    data = write_parquet(tmp_path / "train.parquet", VERL_ROWS)
    seen = tmp_path / "seen.jsonl"
    fn = tmp_path / "rowcheck.py"
    fn.write_text("import json\n"  # verl's compute_score, unchanged
                  "def rowcheck(data_source, solution_str, ground_truth, extra_info=None):\n"
                  f"    open({str(seen)!r}, 'a').write(json.dumps([ground_truth, data_source, extra_info]) + '\\n')\n"
                  "    return 0.0\n")
    args = ["algo=grpo", f"models.actor.path={path}", "data.chat_template=true", f"data.path={data}",
            "data.prompt_len=48", "data.gen_len=4", "data.batch_size=2", "train.iterations=1"]
    cfg = load_settings(None, args + ["reward.rule=gsm8k"])
    batch = setup.encode_prompt_batch(cfg, setup.tokenizer_for(cfg), setup.prompt_records(cfg))
    want = hf.encode(hf.apply_chat_template(VERL_ROWS[0]["prompt"], tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)
    assert batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist() == want
    rec = in_process(cfg, resolve_plan(cfg, "colocated", 1)[0], None)[0]
    assert rec["reward/mean"] == 0.0  # a random model writes no "#### 7"
    cfg = load_settings(None, args + [f"reward.fn={fn}:rowcheck"])
    in_process(cfg, resolve_plan(cfg, "colocated", 1)[0], None)
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    assert {c[0] for c in calls} == {"7", "10"} and all(c[1] == "openai/gsm8k" for c in calls)
    assert {c[2]["index"] for c in calls} == {0, 1}


def test_prompt_and_answer_keys_name_other_fields(tmp_path):
    """data.prompt_key / answer_key (OpenRLHF's --input_key / --label_key): any field names."""
    from meshrl.algo.scoring import eval_records, train_records

    data = tmp_path / "alpaca.jsonl"
    data.write_text(json.dumps({"instruction": "2+2=", "output": "4", "id": 9}) + "\n")
    cfg = load_settings(None, ["algo=grpo", f"data.path={data}", f"eval.path={data}", "data.prompt_key=instruction",
                               "data.answer_key=output"])
    want = {"prompt": "2+2=", "answer": "4", "instruction": "2+2=", "output": "4", "id": 9}
    assert setup.prompt_records(cfg) == train_records(cfg) == eval_records(cfg) == [want]
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"instruction": "a", "response": "b"}) + "\n")
    cfg = load_settings(None, ["algo=sft", f"data.path={sft}", "data.prompt_key=instruction"])
    assert setup.sft_records(cfg) == [{"prompt": "a", "response": "b"}]
    with pytest.raises(UserError, match="data.prompt_key is empty"):
        load_settings(None, ["data.prompt_key="])
