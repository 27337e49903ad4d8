"""JSONL readers: good files load, malformed lines name the file and the line number."""

import pytest

from meshrl.data import demo
from meshrl.data.jsonl import read_jsonl
from meshrl.errors import UserError


def write(tmp_path, text: str):
    p = tmp_path / "d.jsonl"
    p.write_text(text)
    return p


def test_reads_all_three_kinds(tmp_path):
    p = write(tmp_path, '{"prompt": "1+1=", "answer": 2}\n\n{"prompt": "x"}\n')
    assert read_jsonl(p, "prompts") == [{"prompt": "1+1=", "answer": "2"}, {"prompt": "x"}]
    p = write(tmp_path, '{"prompt": "a", "response": "b"}\n')
    assert read_jsonl(p, "sft") == [{"prompt": "a", "response": "b"}]
    p = write(tmp_path, '{"prompt": "a", "chosen": "b", "rejected": "c", "extra": 1}\n')
    assert read_jsonl(p, "pairs") == [{"prompt": "a", "chosen": "b", "rejected": "c"}]


@pytest.mark.parametrize("text, kind, line, words", [
    ('{"prompt": "a", "response": "b"}\n{"prompt": "a", "response": \n', "sft", 2, "not valid JSON"),
    ('{"prompt": "a", "chosen": "b"}\n', "pairs", 1, "missing key"),
    ('{"prompt": "a"}\n[1, 2]\n', "prompts", 2, "expected a JSON object"),
    ('{"prompt": "a"}\n\n{"prompt": ["x"]}\n', "prompts", 3, "must be a string"),
])
def test_malformed_line_names_file_and_line(tmp_path, text, kind, line, words):
    p = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        read_jsonl(p, kind)
    assert f"{p}:{line}:" in str(e.value) and words in str(e.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_jsonl(tmp_path / "nope.jsonl", "sft")
    with pytest.raises(UserError, match="no records"):
        read_jsonl(write(tmp_path, "\n\n"), "sft")


def test_demo_data_is_deterministic_and_checkable():
    assert demo.sft_records(3, 50) == demo.sft_records(3, 50)
    recs = demo.sft_records(3, 2000)
    right = sum(int(r["response"]) == eval(r["prompt"][:-1]) for r in recs) / len(recs)
    assert abs(right - (1 - demo.SFT_NOISE)) < 0.05  # the stated noise level
    for p in demo.preference_records(4, 200):
        assert int(p["chosen"]) == eval(p["prompt"][:-1]) != int(p["rejected"])
