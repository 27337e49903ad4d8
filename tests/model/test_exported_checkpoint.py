"""An exported checkpoint is a complete Hugging Face one (issue 18, items 8 and 9): transformers
loads the model *and* the tokenizer, the byte tokenizer gives ByteTokenizer's ids, files are 0644."""

import os
import random
import stat

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from meshrl.cli import main
from meshrl.model import ByteTokenizer, load_pretrained
from meshrl.model.checkpoint import build_model, save_pretrained
from meshrl.model.tokenizer import load_tokenizer


def texts():
    rng = random.Random(0)
    alphabet = "0123456789+= abcXYZ\n\t\u00e9\u00fc\u6f22\u5b57\U0001f600<>/s"
    yield from ("3+4=", "", " ", "a  b", "<s>", "</s>x")
    for _ in range(200):
        yield "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20)))


def test_auto_tokenizer_loads_the_byte_tokenizer_with_equal_ids(tmp_path):
    ByteTokenizer().save_pretrained(tmp_path)
    hf, ours = AutoTokenizer.from_pretrained(tmp_path), ByteTokenizer()
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (257, 258, 256) and len(hf) == 264
    for text in texts():
        ids = hf(text)["input_ids"]
        if "<s>" in text or "</s>" in text:  # ours has no special-token text; compare bytes only
            continue
        assert ids == ours.encode(text, add_bos=True), text
        assert hf.decode(ids, skip_special_tokens=True) == text == ours.decode(ids)
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)  # and meshrl reads it back as itself


def test_the_trained_demo_actor_is_a_complete_hf_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "train.iterations=1", "sft.steps=2", "data.batch_size=4", "sft.batch_size=8",
                 "--no-progress", "--out", str(out)]) == 0
    actor = out / "actor"
    tok = AutoTokenizer.from_pretrained(actor)
    hf = AutoModelForCausalLM.from_pretrained(actor).eval()
    ids = tok("3+4=", return_tensors="pt")["input_ids"]
    assert ids.tolist() == [ByteTokenizer().encode("3+4=", add_bos=True)]
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, load_pretrained(actor)(ids), atol=1e-4)
    for f in actor.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~_umask(), f.name


def test_weights_are_written_with_the_users_umask(tmp_path):
    save_pretrained(build_model("tiny", seed=0), tmp_path / "m")
    assert stat.S_IMODE((tmp_path / "m" / "model.safetensors").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m
