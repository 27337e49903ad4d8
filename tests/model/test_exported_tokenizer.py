"""The trained model exported from a run whose actor came with a Hugging Face tokenizer is a complete
checkpoint: its tokenizer files and chat template travel with it (found on SmolLM2-135M-Instruct,
issue 17: ``OUT/actor`` held only config.json and the weights, and AutoTokenizer could not load it)."""

from __future__ import annotations

import json

import transformers
from model_hf_util import hf_model  # tests/model is on sys.path (pytest rootdir-less import)
from tokenizers import Tokenizer, models, pre_tokenizers

from meshrl.cli import main
from meshrl.data.chat import load_chat_template
from meshrl.model import HFTokenizer, load_tokenizer

WORDS = "what is one two three four five plus and the answer".split()
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {{ eos_token }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _checkpoint(path):
    specials = ["[PAD]", "<s>", "</s>", "<|user|>", "<|assistant|>"]
    vocab = {t: i for i, t in enumerate(specials + WORDS + ["[UNK]"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    hf_model("llama", kv_heads=1, vocab=len(vocab), tied=True).save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "[PAD]"}))
    (path / "chat_template.jinja").write_text(CHAT)
    return path


def test_save_pretrained_copies_the_tokenizer_files(tmp_path):
    src = _checkpoint(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    HFTokenizer(src).save_pretrained(tmp_path / "dst")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "dst" / name).read_bytes() == (src / name).read_bytes(), name
    HFTokenizer(src).save_pretrained(src)  # onto itself: a no-op, not an error


def test_a_grpo_run_exports_the_actor_with_its_tokenizer_and_template(tmp_path):
    src = _checkpoint(tmp_path / "src")
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "three"}) + "\n"
                            for p in ("what is one plus two", "what is two plus one")))
    out = tmp_path / "run"
    assert main(["train", "algo=grpo", f"models.actor.path={src}", f"models.ref.path={src}", f"data.path={data}",
                 "data.chat_template=true", "data.batch_size=2", "data.gen_len=4", "train.iterations=1",
                 "--no-progress", "--out", str(out)]) == 0
    actor = out / "actor"
    hf_tok, theirs = transformers.AutoTokenizer.from_pretrained(actor), transformers.AutoTokenizer.from_pretrained(src)
    conv = [{"role": "user", "content": "what is one plus two"}]
    want = theirs.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert hf_tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False) == want
    ours = load_tokenizer(actor)
    assert ours.encode(load_chat_template(actor).render({"messages": conv}), add_special_tokens=False) == list(want)
    assert transformers.AutoModelForCausalLM.from_pretrained(actor).config.vocab_size == len(WORDS) + 6
