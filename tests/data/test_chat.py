"""Chat templates rendered by meshrl.data.chat against transformers' apply_chat_template (the
oracle) on a tokenizer directory written here."""

from __future__ import annotations

import json

import pytest
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from meshrl.data.chat import end_of_turn_id, load_chat_template
from meshrl.errors import UserError
from meshrl.model.tokenizer import load_tokenizer

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Llama-3 style: bos first, a system turn required to be first, raise_exception, whitespace control
LLAMA3 = ("{{ bos_token }}{% for message in messages %}"
          "{% if message['role'] == 'system' and not loop.first %}{{ raise_exception('system must be first') }}"
          "{% endif %}"
          "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim "
          "+ '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]


def _tokenizer_dir(path, template: str, as_file: bool):
    words = ["hi", "there", "user", "assistant", "system", "be", "brief", "what", "is", "2", "+", "?", "x"]
    vocab = {t: i for i, t in enumerate(SPECIALS + ["[UNK]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "pad_token": "<pad>"}
    if as_file:
        (path / "chat_template.jinja").write_text(template)
    else:
        cfg["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


RECORDS = [
    {"prompt": "what is 2 + 2 ?"},
    {"prompt": "hi", "system": "be brief"},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
                  {"role": "assistant", "content": "hi"}, {"role": "user", "content": "what is 2 ?"}]},
]


@pytest.mark.parametrize("template,as_file,eot", [(CHATML, False, "<|im_end|>"), (LLAMA3, True, "<|eot_id|>")])
def test_render_matches_transformers(tmp_path, template, as_file, eot):
    path = _tokenizer_dir(tmp_path / "tok", template, as_file)
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    tpl = load_chat_template(path)
    for rec in RECORDS:
        msgs = rec.get("messages") or ([{"role": "system", "content": rec["system"]}] if "system" in rec else []) \
            + [{"role": "user", "content": rec.get("prompt", "")}]
        want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert tpl.render(rec) == want
        assert tpl.render(rec, add_generation_prompt=False) == hf.apply_chat_template(msgs, tokenize=False)
    assert tpl.end_of_turn() == eot
    assert end_of_turn_id(path, load_tokenizer(path)) == hf.convert_tokens_to_ids(eot)


def test_template_errors_name_the_source(tmp_path):
    path = _tokenizer_dir(tmp_path / "tok", LLAMA3, as_file=True)
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}]}
    with pytest.raises(UserError, match="chat_template.jinja failed: system must be first"):
        load_chat_template(path).render(bad)
    with pytest.raises(UserError, match="needs \"messages\" or \"prompt\""):
        load_chat_template(path).render({"question": "hi"})
    none = _tokenizer_dir(tmp_path / "none", CHATML, as_file=False)
    cfg = json.loads((none / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (none / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="no chat template"):
        load_chat_template(none)


def test_sandbox_blocks_attribute_escape(tmp_path):
    """A hub template is untrusted: the sandbox refuses Python internals, as in transformers."""
    path = _tokenizer_dir(tmp_path / "tok", "{{ messages.__class__.__mro__ }}", as_file=True)
    with pytest.raises(UserError, match="unsafe"):
        load_chat_template(path).render({"prompt": "hi"})
