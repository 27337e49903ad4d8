"""ShardMap: every element of every parameter is held by each (dp replica) of the placement,
TP chunks tile dims exactly, and the rules for GQA, PP and tied embeddings hold."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.model.config import ModelConfig
from meshrl.model.presets import get_preset
from meshrl.layout.mesh import Layout, LayoutError, Mesh, Placement
from meshrl.layout.shardmap import intersect, shard_map, slice_numel


def _cfg(layers=4, heads=8, kv=2, tied=False, bias=False):
    return ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied,
                       attention_bias=bias, model_type="qwen2" if bias else "llama")


def _covered_once_per_replica(sm, name):
    """Within each dp replica, the held slices of `name` cover it; distinct slices never partially
    overlap (they are equal or disjoint), and their distinct union has the full size."""
    shape = sm.shapes[name]
    full = 1
    for n in shape:
        full *= n
    lay = sm.placement.layout
    for dp in range(lay.dp):
        slices = {sm.slice_of(sm.placement.rank_of(dp, t, p), name) for t in range(lay.tp) for p in range(lay.pp)}
        slices.discard(None)
        for a, b in itertools.combinations(slices, 2):
            assert intersect(a, b) is None, (name, a, b)
        assert sum(slice_numel(s) for s in slices) == full, name


@settings(max_examples=60, deadline=None)
@given(dp=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 3, 4]),
       tied=st.booleans(), bias=st.booleans(), kv=st.sampled_from([1, 2, 4, 8]), start=st.integers(0, 5),
       value_head=st.booleans())
def test_every_element_held_within_each_replica(dp, tp, pp, tied, bias, kv, start, value_head):
    cfg = _cfg(tied=tied, bias=bias, kv=kv)
    pl = Placement(Mesh.range(start, dp * tp * pp), Layout(dp, tp, pp))
    sm = shard_map(cfg, pl, value_head)
    for name in sm.shapes:
        _covered_once_per_replica(sm, name)


def test_gqa_replicates_kv_heads_when_tp_exceeds_them():
    cfg = _cfg(kv=2)
    sm = shard_map(cfg, Placement(Mesh.range(0, 8), Layout(1, 8, 1)))
    hd = cfg.head_dim
    got = [sm.slice_of(r, "model.layers.0.self_attn.k_proj.weight")[0] for r in range(8)]
    # query heads 0-3 use KV head 0, heads 4-7 use KV head 1 (one query head per TP rank)
    assert got == [(0, hd)] * 4 + [(hd, 2 * hd)] * 4
    assert sm.slice_of(3, "model.layers.0.self_attn.q_proj.weight")[0] == (3 * hd, 4 * hd)


def test_tied_embedding_lives_on_first_and_last_stage():
    cfg = _cfg(tied=True)
    sm = shard_map(cfg, Placement(Mesh.range(0, 2), Layout(1, 1, 2)))
    assert "lm_head.weight" not in sm.shapes
    assert [r for r, _ in sm.holders("model.embed_tokens.weight")] == [0, 1]
    assert [r for r, _ in sm.holders("model.norm.weight")] == [1]
    assert [r for r, _ in sm.holders("model.layers.0.mlp.up_proj.weight")] == [0]


def test_sub_mesh_and_row_parallel():
    sm = shard_map(get_preset("tiny"), Placement(Mesh.range(4, 4), Layout(2, 2, 1)))
    assert sm.slice_of(0, "model.norm.weight") is None
    assert sm.slice_of(5, "model.layers.1.mlp.down_proj.weight") == ((0, 128), (128, 256))
    assert sm.slice_of(6, "model.layers.1.mlp.down_proj.weight") == ((0, 128), (0, 128))


@pytest.mark.parametrize("layout,msg", [
    (Layout(1, 3, 1), "does not divide the model's attention heads"),
    (Layout(1, 1, 5), "larger than the model's 4 layers"),
])
def test_bad_layouts_name_the_number(layout, msg):
    with pytest.raises(LayoutError, match=msg):
        shard_map(_cfg(), Placement(Mesh.range(0, layout.size), layout))


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "mixtral"])
@pytest.mark.parametrize("layout", ["dp1tp1pp1@0", "dp2tp2pp1@0-3", "dp1tp4pp2@0-7", "dp1tp8pp1@0-7"])
def test_families_every_element_held_and_experts_whole(family, layout):
    extra = {"qwen3": dict(num_experts=0), "mixtral": dict(intermediate_size=64)}.get(family, {})
    cfg = get_preset("tiny-moe").replace(model_type=family, **extra)
    sm = shard_map(cfg, Placement.parse(layout))
    for name in sm.shapes:
        _covered_once_per_replica(sm, name)
    tp = sm.placement.layout.tp
    prefix = "block_sparse_moe" if family == "mixtral" else "mlp"
    if family != "qwen3":
        for e in range(8):
            down = "w2" if family == "mixtral" else "down_proj"
            holders = sm.holders(f"model.layers.0.{prefix}.experts.{e}.{down}.weight")
            assert {sm.placement.coords_of(r)[1] for r, _ in holders} == {e // (8 // tp)}
            assert all(sl == ((0, 128), (0, 64)) for _, sl in holders)
    stage0 = sm.placement.layout.dp * tp  # layer 0's ranks: replicated on all of them
    if family != "qwen3":
        assert len(sm.holders(f"model.layers.0.{prefix}.gate.weight")) == stage0
    else:
        assert len(sm.holders("model.layers.0.self_attn.q_norm.weight")) == stage0


def test_experts_must_split_over_tp():
    with pytest.raises(LayoutError, match="does not divide the model's 6 experts"):
        shard_map(get_preset("tiny-moe").replace(num_experts=6, num_experts_per_tok=2),
                  Placement.parse("dp1tp4pp1@0-3"))
