"""Checkpoint I/O: value heads, dtypes, determinism, and one clear error per kind of bad input."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from meshrl.errors import UserError
from meshrl.model import CausalLM, ValueModel, build_model, get_preset, load_pretrained


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    build_model("tiny", seed=1).save_pretrained(d)
    return d


def test_build_model_is_deterministic_and_hf_like():
    a, b, c = build_model("tiny", seed=4), build_model("tiny", seed=4), build_model("tiny", seed=5)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa) and not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])
    assert torch.equal(sa["model.norm.weight"], torch.ones(128))
    assert sa["model.layers.0.mlp.up_proj.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    half = build_model("tiny", seed=4, dtype=torch.bfloat16)
    assert half.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(half.lm_head.weight, a.lm_head.weight.to(torch.bfloat16))


def test_value_model_from_causal_lm_checkpoint(ckpt, tmp_path):
    lm = load_pretrained(ckpt)
    v = load_pretrained(ckpt, value_head=True, seed=3)
    assert isinstance(v, ValueModel) and isinstance(lm, CausalLM)
    assert torch.equal(v.model.embed_tokens.weight, lm.model.embed_tokens.weight)
    assert torch.equal(v.score.weight, load_pretrained(ckpt, value_head=True, seed=3).score.weight)
    ids = torch.randint(0, 264, (2, 9))
    with torch.no_grad():
        values = v(ids)
        assert values.shape == (2, 9)
        # The value is the score head applied to the same final hidden states as the LM head.
        assert torch.allclose(values, v.score(lm.model(ids)).squeeze(-1), atol=1e-6)
    v.save_pretrained(tmp_path / "critic")
    cfg = json.loads((tmp_path / "critic" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForTokenClassification"] and cfg["num_labels"] == 1
    # transformers reads it as LlamaForTokenClassification (its score.bias starts at 0): same values.
    import transformers
    hf = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "critic", dtype=torch.float32)
    with torch.no_grad():
        assert (hf.eval()(ids).logits.squeeze(-1) - values).abs().max().item() <= 1e-5
    back = load_pretrained(tmp_path / "critic", value_head=True)
    assert torch.equal(back.score.weight, v.score.weight)
    with pytest.raises(UserError, match="value model.*value_head=True"):
        load_pretrained(tmp_path / "critic")


def test_bf16_checkpoint_loads_as_float32(tmp_path):
    m = build_model("tiny", seed=2, dtype=torch.bfloat16)
    m.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back = load_pretrained(tmp_path)
    assert back.lm_head.weight.dtype == torch.float32
    assert torch.equal(back.lm_head.weight, m.lm_head.weight.float())


def _rewrite(d, fn):
    path = d / "model.safetensors"
    state = load_file(path)
    fn(state)
    save_file(state, path)


def _edit_config(d, **kw):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(kw)
    (d / "config.json").write_text(json.dumps(cfg))


BAD = {
    "missing dir": (lambda d: d.rename(d.parent / "gone"), r"'.*ckpt' does not exist"),
    "no config": (lambda d: (d / "config.json").unlink(), "no config.json"),
    "malformed config": (lambda d: (d / "config.json").write_text("{not json"), r"config\.json: malformed JSON"),
    "architecture": (lambda d: _edit_config(d, model_type="gpt2", architectures=["GPT2LMHeadModel"]),
                     r"config\.json: unsupported architecture.*gpt2"),
    "bad value": (lambda d: _edit_config(d, num_attention_heads=3), r"config\.json: .*num_attention_heads=3"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), r"no model\.safetensors"),
    "pickle only": (lambda d: ((d / "model.safetensors").rename(d / "pytorch_model.bin")), "pickle"),
    "corrupt weights": (lambda d: (d / "model.safetensors").write_bytes(b"garbage" * 10),
                        r"model\.safetensors: not a readable safetensors"),
    "missing tensor": (lambda d: _rewrite(d, lambda s: s.pop("model.layers.3.mlp.up_proj.weight")),
                       r"lacks tensor 'model\.layers\.3\.mlp\.up_proj\.weight'"),
    "unexpected tensor": (lambda d: _rewrite(d, lambda s: s.update({"model.extra.weight": torch.zeros(2)})),
                          r"unexpected tensor 'model\.extra\.weight'"),
    "shape": (lambda d: _rewrite(d, lambda s: s.update({"model.layers.0.self_attn.k_proj.weight":
                                                        torch.zeros(64, 128)})),
              r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \[64, 128\].*\[32, 128\]"),
    "config vs weights": (lambda d: _edit_config(d, hidden_size=256, head_dim=16),
                          r"model\.safetensors: tensor 'model\.embed_tokens\.weight' has shape \[264, 128\]"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_gives_one_clear_error(ckpt, case):
    breaker, pattern = BAD[case]
    breaker(ckpt)
    with pytest.raises(UserError, match=pattern):
        load_pretrained(ckpt)


def test_sharded_index_errors(tmp_path):
    build_model("tiny", seed=1).save_pretrained(tmp_path, max_shard_bytes=1_000_000)
    index = tmp_path / "model.safetensors.index.json"
    last = sorted(tmp_path.glob("model-*-of-*.safetensors"))[-1]
    last.unlink()
    with pytest.raises(UserError, match=f"{last.name}.*missing"):
        load_pretrained(tmp_path)
    index.write_text("[]")
    with pytest.raises(UserError, match="malformed index"):
        load_pretrained(tmp_path)


def test_resave_replaces_old_shards(tmp_path):
    build_model("tiny", seed=1).save_pretrained(tmp_path, max_shard_bytes=1_000_000)
    m = build_model("tiny", seed=2)
    m.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(load_pretrained(tmp_path).lm_head.weight, m.lm_head.weight)


PUBLISHED = {  # total parameters of the released checkpoints
    "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "codellama-34b": 33_743_970_304,
    "llama2-70b": 68_976_648_192, "qwen2.5-0.5b": 494_032_768, "qwen2.5-7b": 7_615_616_512,
    "llama3.1-8b": 8_030_261_248, "qwen3-8b": 8_190_735_360, "qwen3-30b-a3b": 30_532_122_624,
    "mixtral-8x7b": 46_702_792_704,
}
ACTIVE = {"qwen3-30b-a3b": 3.3e9, "mixtral-8x7b": 12.9e9}  # the model cards' "activated parameters"


@pytest.mark.parametrize("name", list(ACTIVE))
def test_moe_preset_active_parameters_match_the_model_cards(name):
    from meshrl.model.config import active_params
    assert abs(active_params(get_preset(name)) - ACTIVE[name]) / ACTIVE[name] < 0.02


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_parameter_counts_match_published(name):
    from meshrl.model import num_params
    assert num_params(get_preset(name)) == PUBLISHED[name]


def test_small_presets_sizes_and_real_modules():
    from meshrl.model import num_params
    tiny = build_model("tiny")
    assert sum(p.numel() for p in tiny.parameters()) == num_params(get_preset("tiny"))
    assert 0.9e6 < num_params(get_preset("tiny")) < 1.5e6
    assert 80e6 < num_params(get_preset("small")) < 120e6
    with torch.device("meta"):
        assert sum(p.numel() for p in CausalLM(get_preset("llama2-7b")).parameters()) == PUBLISHED["llama2-7b"]
    with pytest.raises(UserError, match="unknown model preset 'huge'"):
        get_preset("huge")
