"""Our model against transformers: logits, padded batches, checkpoints both ways, greedy generation."""

from __future__ import annotations

import pytest
import torch
import transformers

from meshrl.model import GenerationConfig, build_model, generate, load_pretrained, read_config

from model_hf_util import hf_model  # tests/model is on sys.path (pytest rootdir-less import)

CASES = [  # (architecture, kv heads, tied embeddings)
    ("llama", 2, False), ("llama", 1, True), ("llama", 4, False),
    ("qwen2", 2, True), ("qwen2", 1, False),
    ("mistral", 2, False), ("mistral", 1, True),
]


def _ids(vocab: int, b: int = 3, s: int = 19, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (b, s), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch,kv,tied", CASES)
def test_logits_match_transformers(tmp_path, arch, kv, tied):
    ref = hf_model(arch, kv_heads=kv, tied=tied)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied
    ids = _ids(ref.config.vocab_size)
    with torch.no_grad():
        diff = (ours(ids) - ref(ids).logits).abs().max().item()
    assert diff <= 1e-4, f"{arch} kv={kv} tied={tied}: max abs diff {diff}"


def test_sliding_window_matches_transformers(tmp_path):
    """Mistral with a window shorter than the sequence: the mask path, not the plain causal one."""
    ref = hf_model("mistral", kv_heads=1, sliding_window=6)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    assert ours.config.sliding_window == 6
    ids = _ids(ref.config.vocab_size)
    with torch.no_grad():
        windowed = ours(ids)
        assert (windowed - ref(ids).logits).abs().max().item() <= 1e-4
        ours.model.cfg = ours.config.replace(sliding_window=None)  # the window really matters here
        assert (ours(ids) - windowed).abs().max().item() > 1e-3


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_transformers(tmp_path, side):
    ref = hf_model("qwen2", kv_heads=1)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    ids = _ids(ref.config.vocab_size, b=3, s=12)
    mask = torch.ones_like(ids)
    for row, n_pad in ((0, 5), (2, 2)):
        if side == "left":
            mask[row, :n_pad] = 0
        else:
            mask[row, -n_pad:] = 0
    with torch.no_grad():
        a, b = ours(ids, mask), ref(ids, attention_mask=mask).logits
        real = mask.bool()
        assert (a[real] - b[real]).abs().max().item() <= 1e-4
        # A padded row equals the same row alone, unpadded.
        alone = ours(ids[0:1][mask[0:1].bool()].view(1, -1))
    assert (a[0][mask[0].bool()] - alone[0]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("tied", [False, True])
def test_save_then_load_in_transformers(tmp_path, tied):
    """Our random init -> our save_pretrained -> transformers' from_pretrained: same logits."""
    hf_model("qwen2", kv_heads=1, tied=tied, vocab=80).save_pretrained(tmp_path / "shape")
    cfg = read_config(tmp_path / "shape")[0]
    ours = build_model(cfg, seed=3)
    ours.save_pretrained(tmp_path / "ours")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    assert (ref.lm_head.weight is ref.model.embed_tokens.weight) == tied
    ids = _ids(80)
    with torch.no_grad():
        assert (ours(ids) - ref(ids).logits).abs().max().item() <= 1e-4


def test_sharded_save_round_trip(tmp_path):
    ours = build_model("tiny", seed=5)
    ours.save_pretrained(tmp_path, max_shard_bytes=400_000)
    shards = sorted(p.name for p in tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3 and (tmp_path / "model.safetensors.index.json").is_file()
    back = load_pretrained(tmp_path)
    for (n, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = _ids(264)
    with torch.no_grad():
        assert (ours(ids) - ref(ids).logits).abs().max().item() <= 1e-4


def _hf_greedy(ref, ids: torch.Tensor, mask: torch.Tensor, eos: int | None) -> list[list[int]]:
    out = ref.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=0,
                       eos_token_id=eos)
    return out[:, ids.shape[1]:].tolist()


def _trim(rows: list[list[int]], n: int) -> list[list[int]]:
    """Pad rows with 0 to n columns (HF stops when every row is done; a row alone may stop earlier)."""
    return [r + [0] * (n - len(r)) for r in rows]


@pytest.mark.parametrize("arch,kv,tied,eos", [("llama", 2, False, None), ("qwen2", 1, True, None),
                                              ("mistral", 1, False, None), ("mistral", 1, False, 2)])
def test_greedy_generation_matches_transformers(tmp_path, arch, kv, tied, eos):
    ref = hf_model(arch, kv_heads=kv, tied=tied, eos_token_id=eos)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    prompts = [[5, 17, 33, 9, 41, 12, 7], [8, 3, 60], [22, 4, 19, 70, 3]]
    cfg = GenerationConfig(max_new_tokens=32, greedy=True, eos_token_id=eos, pad_token_id=0)
    got = generate(ours, prompts, cfg).responses.tolist()
    if eos is None:
        assert len(got[0]) == 32
    else:
        assert any(eos in row for row in got), "the EOS case should stop at least one row early"
    # Each prompt alone, unpadded; then all batched with left padding, as HF requires for generation.
    for i, p in enumerate(prompts):
        want = _hf_greedy(ref, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), eos)
        assert _trim(want, len(got[i]))[0] == got[i], f"prompt {i}"
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long()
    assert _trim(_hf_greedy(ref, ids, mask, eos), len(got[0])) == got
