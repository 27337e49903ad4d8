"""Qwen3, scaled RoPE (llama3, yarn, linear, dynamic), Qwen3-MoE and Mixtral against transformers:
logits beyond the original context, greedy generation, config.json round trips both ways."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from meshrl.model import GenerationConfig, build_model, generate, load_pretrained, read_config

from model_hf_util import hf_family_model  # tests/model is on sys.path

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
CASES = {  # name -> (family, config overrides); max_position_embeddings is 32, sequences run to 48
    "qwen3": ("qwen3", {}),
    "qwen3-hd24-kv1-tied": ("qwen3", dict(head_dim=24, num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen3-yarn": ("qwen3", dict(rope_scaling=YARN)),
    "llama3": ("llama", dict(rope_scaling=LLAMA3)),
    "llama3-theta5e5": ("llama", dict(rope_scaling={**LLAMA3, "factor": 32.0}, rope_theta=5e5, head_dim=32)),
    "llama-yarn-mscale": ("llama", dict(rope_scaling={**YARN, "mscale": 0.7, "mscale_all_dim": 0.3,
                                                       "beta_fast": 16, "beta_slow": 2})),
    "qwen2-yarn": ("qwen2", dict(rope_scaling=YARN, num_key_value_heads=1)),
    "llama-linear": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral-dynamic": ("mistral", dict(rope_scaling={"rope_type": "dynamic", "factor": 3.0}, sliding_window=None)),
    "qwen3-moe": ("qwen3_moe", {}),
    "qwen3-moe-unnormed-sparse2": ("qwen3_moe", dict(norm_topk_prob=False, num_experts=6, num_experts_per_tok=3,
                                                     decoder_sparse_step=2, num_hidden_layers=3)),
    "qwen3-moe-mlp-only-yarn": ("qwen3_moe", dict(mlp_only_layers=[0], rope_scaling=YARN)),
    "mixtral": ("mixtral", dict(sliding_window=None)),
    "mixtral-top1-e8": ("mixtral", dict(num_local_experts=8, num_experts_per_tok=1, sliding_window=None)),
}


def _ids(vocab: int, b: int = 2, s: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (b, s), generator=torch.Generator().manual_seed(seed))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers_beyond_context(tmp_path, case):
    family, extra = CASES[case]
    ref = hf_family_model(family, **extra)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    assert ours.config.model_type == family
    ids = _ids(ref.config.vocab_size)  # 48 tokens > max_position_embeddings = 32 > original 16
    with torch.no_grad():
        rel = _rel(ours(ids), ref(ids).logits)
        assert rel <= 1e-4, f"{case}: max relative diff {rel}"
        if ours.config.rope_scaling is not None:  # the scaling really changes these logits
            ours.model.cfg = ours.config.replace(rope_scaling=None)
            assert _rel(ours(ids), ref(ids).logits) > 1e-3


@pytest.mark.parametrize("case", ["qwen3", "llama3", "qwen3-yarn", "qwen3-moe", "mixtral", "mistral-dynamic"])
def test_greedy_generation_matches_transformers(tmp_path, case):
    family, extra = CASES[case]
    ref = hf_family_model(family, **extra)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    prompts = [[5, 17, 33, 9, 41, 12, 7, 50, 22, 61, 4, 30]]  # generation runs past position 32
    got = generate(ours, prompts, GenerationConfig(max_new_tokens=30, greedy=True, pad_token_id=0)).responses
    want = ref.generate(torch.tensor(prompts), attention_mask=torch.ones(1, 12, dtype=torch.long),
                        max_new_tokens=30, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert got.tolist() == want[:, 12:].tolist()


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling"])
def test_config_round_trip_keeps_rope_spelling(tmp_path, spelling):
    """transformers 5 writes rope_parameters; transformers 4 checkpoints carry rope_theta +
    rope_scaling. Both load, and export writes the spelling it read, which transformers reads back."""
    hf_family_model("llama", rope_scaling=LLAMA3).save_pretrained(tmp_path / "a")
    raw = json.loads((tmp_path / "a" / "config.json").read_text())
    assert "rope_parameters" in raw
    if spelling == "rope_scaling":
        params = raw.pop("rope_parameters")
        raw["rope_theta"] = params.pop("rope_theta")
        raw["rope_scaling"] = params
        (tmp_path / "a" / "config.json").write_text(json.dumps(raw))
    ours = load_pretrained(tmp_path / "a")
    assert ours.config.rope_format == spelling and ours.config.rope_scaling.rope_type == "llama3"
    ours.save_pretrained(tmp_path / "b")
    back = json.loads((tmp_path / "b" / "config.json").read_text())
    assert spelling in back and ("rope_parameters" in back) == (spelling == "rope_parameters")
    assert read_config(tmp_path / "b")[0] == ours.config
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float32).eval()
    ids = _ids(96)
    with torch.no_grad():
        assert _rel(ours(ids), ref(ids).logits) <= 1e-4


@pytest.mark.parametrize("case", ["qwen3-hd24-kv1-tied", "qwen3-moe-unnormed-sparse2", "mixtral", "llama-yarn-mscale"])
def test_export_reads_back_in_transformers(tmp_path, case):
    """Our random init of each family -> our save_pretrained -> transformers: same logits."""
    family, extra = CASES[case]
    hf_family_model(family, **extra).save_pretrained(tmp_path / "shape")
    cfg = read_config(tmp_path / "shape")[0]
    ours = build_model(cfg, seed=3)
    ours.save_pretrained(tmp_path / "ours")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    assert type(ref).__name__ == type(hf_family_model(family, **extra)).__name__
    ids = _ids(96, s=40)
    with torch.no_grad():
        assert _rel(ours(ids), ref(ids).logits) <= 1e-4


def test_unsupported_rope_and_families_name_the_culprit(tmp_path):
    from meshrl.errors import UserError
    from meshrl.model.hf_config import config_from_hf, config_to_hf
    base = json.loads(json.dumps(config_to_hf(build_model("tiny").config)))
    for patch, words in [({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
                         ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
                         ({"model_type": "qwen3", "use_sliding_window": True}, "use_sliding_window"),
                         ({"model_type": "qwen3_moe"}, "num_experts"),
                         ({"model_type": "gpt2"}, "gpt2")]:
        with pytest.raises(UserError, match=words):
            config_from_hf({**base, **patch})
