"""Tokenizers and ``meshrl generate``: a checkpoint holding a real tokenizer.json, against transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from model_hf_util import hf_model  # tests/model is on sys.path (pytest rootdir-less import)
from tokenizers import Tokenizer, models, pre_tokenizers

from meshrl.cli import main
from meshrl.errors import UserError
from meshrl.model import ByteTokenizer, HFTokenizer, build_model, load_tokenizer

WORDS = ("the a cat dog sat ran on under mat log big small red blue and then it was very happy sad "
         "today home away fast slow up down in out over near far").split()


def _word_tokenizer() -> Tokenizer:
    """A WordLevel tokenizer: [PAD]=0, [UNK]=1, </s>=2, then one id per word."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[PAD]", "[UNK]", "</s>"])
    return tok


@pytest.fixture
def hf_ckpt(tmp_path):
    """An HF llama checkpoint directory with its tokenizer.json and tokenizer_config.json."""
    tok = _word_tokenizer()
    ref = hf_model("llama", kv_heads=1, vocab=tok.get_vocab_size(), eos_token_id=2, pad_token_id=0)
    ref.save_pretrained(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"},
                                                                "pad_token": "[PAD]"}))
    return tmp_path, ref, tok


def test_byte_tokenizer_round_trip():
    t = ByteTokenizer()
    ids = t.encode("héllo ✓")
    assert all(0 <= i < 256 for i in ids) and t.decode(ids) == "héllo ✓"
    assert t.encode("x", add_bos=True) == [257, 120]
    assert t.decode([257, 104, 105, 258, 256]) == "hi"
    assert t.vocab_size == build_model("tiny").config.vocab_size == 264


def test_hf_tokenizer_special_ids(hf_ckpt):
    path, _, tok = hf_ckpt
    t = load_tokenizer(path)
    assert isinstance(t, HFTokenizer) and (t.eos_token_id, t.pad_token_id) == (2, 0)
    assert t.bos_token_id == 1  # not in tokenizer_config.json: taken from config.json
    assert t.encode("the cat sat") == tok.encode("the cat sat").ids == [3, 5, 7]
    assert t.decode([3, 5, 2, 7]) == "the cat sat"


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(UserError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(UserError, match=r"tokenizer\.json: cannot read tokenizer"):
        load_tokenizer(tmp_path)


def test_cli_greedy_matches_transformers(hf_ckpt, capsys):
    path, ref, tok = hf_ckpt
    prompt = "the big cat sat on the mat and then"
    ids = tok.encode(prompt).ids
    want = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                        max_new_tokens=32, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    assert main(["generate", "--model", str(path), "--prompt", prompt, "--greedy"]) == 0
    printed = capsys.readouterr().out
    assert printed == tok.decode(want, skip_special_tokens=True) + "\n"
    assert len(printed.split()) >= 8  # a real completion, not an immediate EOS


def test_cli_sampling_is_seeded(tmp_path, capsys):
    build_model("tiny", seed=3).save_pretrained(tmp_path)
    ByteTokenizer().save_pretrained(tmp_path)
    outs = []
    for seed in (1, 1, 2):
        assert main(["generate", "--model", str(tmp_path), "--prompt", "Hi", "--top-p", "0.9",
                     "--temperature", "0.8", "--seed", str(seed)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] != outs[2]


@pytest.mark.parametrize("argv,match", [
    (["--model", "no/such/dir", "--prompt", "x"], "neither a checkpoint directory nor a preset"),
    (["--model", "tiny", "--prompt", "x", "--top-p", "1.5"], "top_p"),
    (["--model", "tiny", "--prompt", ""], "no tokens"),
])
def test_cli_bad_input(argv, match, capsys):
    assert main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshrl generate: error:") and match in err and "Traceback" not in err


def test_cli_unsupported_architecture_exits_2_without_traceback(tmp_path):
    """Through the real console entry point, in a fresh process."""
    build_model("tiny").save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    r = subprocess.run([sys.executable, "-m", "meshrl.cli", "generate", "--model", str(tmp_path),
                        "--prompt", "x"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert "config.json: unsupported architecture" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
