"""``meshrl generate``: one encoding of a prompt for training and generation (issue 18 #1), many
prompts from a JSONL file with --json, --chat through the checkpoint's template; against
transformers (model, tokenizer and chat template) as the oracle."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from model_hf_util import hf_model
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from meshrl.cli import main
from meshrl.data.encode import encode_prompts
from meshrl.model import ByteTokenizer, GenerationConfig, build_model, generate, load_tokenizer

WORDS = "the a cat dog sat ran on under mat big red and then it was happy today home fast up in".split()
CHAT = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {{ eos_token }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _tokenizer() -> Tokenizer:
    """WordLevel: [PAD]=0, <s>=1, </s>=2, role markers, words. Its post-processor adds BOS, as
    LLaMA's does: the tokenizer's own way of encoding a prompt."""
    specials = ["[PAD]", "<s>", "</s>", "<|user|>", "<|system|>", "<|assistant|>"]
    vocab = {t: i for i, t in enumerate(specials + WORDS + ["[UNK]"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf")
    tok = _tokenizer()
    ref = hf_model("llama", kv_heads=1, vocab=tok.get_vocab_size(), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    ref.save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "[PAD]", "chat_template": CHAT}))
    return path, ref, transformers.AutoTokenizer.from_pretrained(path)


def _hf_greedy(ref, ids: list[int], n: int) -> list[int]:
    out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                       max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=2)[0, len(ids):].tolist()
    return out[:out.index(2) + 1] if 2 in out else out


def _json_run(capsys, *argv) -> dict:
    assert main(["generate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("adds_bos", [True, False])
def test_training_encodes_a_prompt_as_the_tokenizer_does(ckpt, tmp_path, adds_bos):
    """Training's prompt ids are the tokenizer's own (transformers' AutoTokenizer as the oracle):
    BOS where its post-processor adds one (LLaMA), and none where it adds none (Qwen2), even though
    config.json names a bos_token_id. The old encoding added that BOS regardless."""
    path = ckpt[0]
    if not adds_bos:
        raw = _tokenizer()
        raw.post_processor = None
        raw.save(str(tmp_path / "tokenizer.json"))
        (tmp_path / "config.json").write_text((path / "config.json").read_text())  # bos_token_id: 1
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "pad_token": "[PAD]"}))
        path = tmp_path
    tok, hf_tok = load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path)
    batch = encode_prompts(tok, [{"prompt": "the cat sat", "answer": "up"}], 8, 4)
    row = batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist()
    assert row == hf_tok("the cat sat")["input_ids"] == ([1] if adds_bos else []) + [6, 8, 10]


def test_generate_uses_the_training_encoding(tmp_path, capsys):
    """The demo's byte tokenizer: `meshrl generate --prompt` completes the prompt as training fed it
    (with BOS). Fails on the old CLI, which dropped the BOS."""
    model = build_model("tiny", seed=5)
    model.save_pretrained(tmp_path)
    tok = ByteTokenizer()
    tok.save_pretrained(tmp_path)
    batch = encode_prompts(tok, [{"prompt": "3+4=", "answer": "7"}], 16, 4)
    trained_ids = batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist()
    assert trained_ids[0] == tok.bos_token_id
    cfg = GenerationConfig(max_new_tokens=12, greedy=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    out = generate(model, [trained_ids], cfg)
    want = tok.decode(out.responses[0, :int(out.response_mask[0].sum())].tolist())
    no_bos = generate(model, [trained_ids[1:]], cfg)
    assert no_bos.responses[0].tolist() != out.responses[0].tolist()  # the test can tell them apart
    assert main(["generate", "--model", str(tmp_path), "--prompt", "3+4=", "--greedy", "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_prompts_file_json_equals_transformers_in_input_order(ckpt, tmp_path, capsys):
    path, ref, hf_tok = ckpt
    texts = ["the cat sat on the mat and then", "a dog", "it was a big red dog and", "home", "then the cat ran up"]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    got = _json_run(capsys, "--model", str(path), "--prompts", str(f), "--greedy", "--max-new-tokens", "10",
                    "--batch-size", "2")
    assert sorted(got) == ["completions", "dtype", "seconds", "tokens_per_s"]
    assert got["dtype"] == "float32"  # auto under tests/conftest.py's MESHRL_CPU_BF16=0
    want = [_hf_greedy(ref, hf_tok(t)["input_ids"], 10) for t in texts]
    assert got["completions"] == [hf_tok.decode(w, skip_special_tokens=True) for w in want]
    assert got["seconds"] > 0 and got["tokens_per_s"] == pytest.approx(sum(map(len, want)) / got["seconds"])


@pytest.mark.parametrize("bf16, want", [("1", "bfloat16"), ("0", "float32")])
def test_dtype_auto_follows_train_dtype_auto(monkeypatch, capsys, bf16, want):
    """--dtype auto (the default) is train.dtype=auto's rule ($MESHRL_CPU_BF16 stands for the CPU's
    bf16 dot products here), says so on stderr and in the JSON; an explicit dtype wins."""
    monkeypatch.setenv("MESHRL_CPU_BF16", bf16)
    assert main(["generate", "--model", "tiny", "--prompt", "hi", "--max-new-tokens", "3", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["dtype"] == want and f"dtype: {want} (--dtype auto" in out.err
    assert main(["generate", "--model", "tiny", "--prompt", "hi", "--max-new-tokens", "3", "--json",
                 "--dtype", "float32"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["dtype"] == "float32" and "--dtype auto" not in out.err


def test_sampled_completions_do_not_depend_on_the_batch_size(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("Hi", "Once upon", "a", "The end of it")))
    runs = [_json_run(capsys, "--model", "tiny", "--prompts", str(f), "--batch-size", str(b), "--seed", "3",
                      "--top-k", "20", "--max-new-tokens", "8")["completions"] for b in (1, 3, 4)]
    assert runs[0] == runs[1] == runs[2] and len(set(runs[0])) == 4
    other = _json_run(capsys, "--model", "tiny", "--prompts", str(f), "--seed", "4", "--top-k", "20",
                      "--max-new-tokens", "8")["completions"]
    assert other != runs[0]


def test_chat_applies_the_checkpoint_template_as_transformers(ckpt, tmp_path, capsys):
    path, ref, hf_tok = ckpt
    convs = [[{"role": "user", "content": "the cat sat"}],
             [{"role": "system", "content": "a dog"}, {"role": "user", "content": "it was big and"}]]
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"messages": convs[0]}) + "\n" + json.dumps({"messages": convs[1]}) + "\n")
    got = _json_run(capsys, "--model", str(path), "--prompts", str(f), "--chat", "--greedy", "--max-new-tokens", "8")
    for conv, text in zip(convs, got["completions"], strict=True):
        ids = hf_tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ids[0] == 1 and ids.count(1) == 1  # the template's BOS, none added on top
        assert text == hf_tok.decode(_hf_greedy(ref, ids, 8), skip_special_tokens=True)


@pytest.mark.parametrize("lines,extra,match", [
    (['{"prompt": "a"}', "{oops"], [], ":2: not JSON"),
    (['{"text": "a"}'], [], ':1: expected an object with "prompt"'),
    (['{"messages": [{"role": "user", "content": "a"}]}'], [], "needs --chat"),
    (['{"prompt": 3}'], [], '"prompt" must be a string'),
    ([""], [], "no prompts"),
    (['{"prompt": "a"}'], ["--batch-size", "0"], "--batch-size must be >= 1"),
    (['{"prompt": "a"}'], ["--chat"], "--chat needs a checkpoint directory"),
])
def test_bad_prompts_file(tmp_path, capsys, lines, extra, match):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    assert main(["generate", "--model", "tiny", "--prompts", str(f), *extra]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_missing_prompts_file(tmp_path, capsys):
    assert main(["generate", "--model", "tiny", "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "--prompts: no file at" in capsys.readouterr().err


def test_prompts_from_parquet_and_trl_conversational_lines(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = tmp_path / "p.jsonl"
    lines.write_text(json.dumps({"prompt": "the cat"}) + "\n" + json.dumps({"prompt": "a dog"}) + "\n")
    table = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "the cat", "id": 1}, {"prompt": "a dog", "id": 2}]), table)
    args = ["--model", "tiny", "--greedy", "--max-new-tokens", "4"]
    want = _json_run(capsys, *args, "--prompts", str(lines))["completions"]
    assert _json_run(capsys, *args, "--prompts", str(table))["completions"] == want
    conv = tmp_path / "c.jsonl"
    conv.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["generate", "--model", "tiny", "--prompts", str(conv)]) == 2
    assert '"messages" needs --chat' in capsys.readouterr().err
