"""ReallocPlan and its bucket schedule, property-based over random models, meshes and layouts.

The coverage check simulates the executor: it counts, for every destination element, the local
copies plus the bucket pieces the executor sends (schedule.link_buckets, the very list it runs)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.model.config import ModelConfig, num_params
from meshrl.model.presets import get_preset
from meshrl.layout.mesh import Layout, Mesh, Placement
from meshrl.layout.realloc_plan import link_bytes, realloc_plan
from meshrl.realloc.schedule import chop, link_buckets
from meshrl.layout.shardmap import check_shardable, intersect, shard_map, slice_numel

WORLD = 16


@st.composite
def models(draw):
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 12]))
    kv = draw(st.sampled_from([k for k in (1, 2, 3, 4, 6, 12) if heads % k == 0]))
    head_dim = draw(st.sampled_from([2, 4]))
    family = draw(st.sampled_from(["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"]))
    moe = {}
    inter = 12 * draw(st.integers(1, 2))
    if family in ("qwen3_moe", "mixtral"):  # experts: whole tensors over tp; some layers dense
        # Mixtral's experts are intermediate_size wide (its config has no separate expert width)
        width = inter if family == "mixtral" else draw(st.sampled_from([4, 6]))
        moe = dict(num_experts=draw(st.sampled_from([2, 3, 4, 6, 12])), num_experts_per_tok=1,
                   moe_intermediate_size=width)
        if family == "qwen3_moe":
            moe.update(decoder_sparse_step=draw(st.integers(1, 2)),
                       mlp_only_layers=tuple(draw(st.sets(st.integers(0, 4), max_size=2))))
    return ModelConfig(vocab_size=12 * draw(st.integers(1, 3)), hidden_size=draw(st.sampled_from([6, 8, 12])),
                       intermediate_size=inter,
                       num_hidden_layers=draw(st.integers(1, 5)),
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                       tie_word_embeddings=draw(st.booleans()), attention_bias=family == "qwen2",
                       model_type=family, **moe)


@st.composite
def placements(draw, cfg):
    """A valid layout for cfg on a random set of ranks of a 16-rank world (any order)."""
    layouts = []
    for tp in (1, 2, 3, 4, 6, 12):
        for pp in range(1, 5):
            for dp in (1, 2, 3):
                pl = Placement(Mesh.range(0, dp * tp * pp), Layout(dp, tp, pp))
                try:
                    check_shardable(cfg, pl)
                except ValueError:
                    continue
                if dp * tp * pp <= WORLD:
                    layouts.append(pl.layout)
    lay = draw(st.sampled_from(layouts))
    ranks = draw(st.permutations(range(WORLD)))[:lay.size]
    return Placement(Mesh(tuple(ranks)), lay)


@st.composite
def cases(draw):
    cfg = draw(models())
    return cfg, draw(placements(cfg)), draw(placements(cfg)), draw(st.booleans())


def _check_plan(cfg, src_pl, dst_pl, value_head, bucket_bytes):
    src, dst = shard_map(cfg, src_pl, value_head), shard_map(cfg, dst_pl, value_head)
    plan = realloc_plan(src, dst, dtype_bytes=4)
    buckets = link_buckets(plan, bucket_bytes)
    # Every piece the executor sends lies inside what its sender holds, and no bucket is too big.
    pieces = [p for bs in buckets.values() for b in bs for p in b.pieces]
    for b in (b for bs in buckets.values() for b in bs):
        assert b.nbytes <= max(bucket_bytes, 4 * max(slice_numel(p.region) for p in b.pieces))
    for p in pieces + plan.copies:
        held = src.slice_of(p.src, p.name)
        assert held is not None and intersect(held, p.region) == p.region, p
    # Every destination element is written exactly once, and only what it lacked locally arrives.
    counts = {(r, n): np.zeros([b - a for a, b in s], dtype=np.int32)
              for r in dst_pl.mesh.ranks for n, s in dst.params_of(r).items()}
    for p in pieces + plan.copies:
        origin = dst.slice_of(p.dst, p.name)
        box = tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(p.region, origin, strict=True))
        counts[(p.dst, p.name)][box] += 1
    lacking = 0
    for (r, n), c in counts.items():
        assert (c == 1).all(), (r, n)
        own = src.slice_of(r, n)
        overlap = intersect(own, dst.slice_of(r, n)) if own is not None else None
        lacking += c.size - (slice_numel(overlap) if overlap else 0)
    assert plan.bytes == 4 * lacking == sum(p.nbytes for p in pieces)
    assert sum(b.nbytes for bs in buckets.values() for b in bs) == plan.bytes
    assert {k: sum(b.nbytes for b in bs) for k, bs in buckets.items()} == plan.link_bytes()
    assert link_bytes(cfg, src_pl, dst_pl, value_head, dtype_bytes=4) == plan.link_bytes()
    return plan


@settings(max_examples=300, deadline=None)
@given(case=cases(), bucket_bytes=st.sampled_from([4, 12, 64, 1 << 20]))
def test_every_destination_element_has_exactly_one_source(case, bucket_bytes):
    _check_plan(*case, bucket_bytes)


def test_experts_move_whole_between_tp_groups():
    """tiny-moe (8 experts a layer) from tp=4 to tp=2 on other ranks: each expert tensor arrives
    whole from the one source rank that held it, and nothing else of it moves."""
    cfg = get_preset("tiny-moe")
    src, dst = Placement.parse("dp1tp4pp1@0-3"), Placement.parse("dp2tp2pp1@4-7")
    plan = _check_plan(cfg, src, dst, False, 1 << 20)
    name = "model.layers.3.mlp.experts.5.up_proj.weight"
    moves = [t for t in plan.transfers if t.name == name]
    assert {t.src for t in moves} == {2}  # expert 5 of 8 lives on tp rank 2 of 4
    assert {t.dst for t in moves} == {5, 7}  # tp rank 1 of 2 in each dp replica
    assert sum(t.nbytes for t in moves) == 2 * 4 * 64 * 128


def test_same_layout_same_mesh_moves_nothing():
    pl = Placement.parse("dp2tp2pp2@0-7")
    plan = _check_plan(get_preset("tiny"), pl, pl, False, 1 << 20)
    assert plan.bytes == 0 and plan.transfers == []


def test_replicas_share_the_sending_load():
    cfg = get_preset("tiny")
    src, dst = Placement.parse("dp4tp1pp1@0-3"), Placement.parse("dp1tp2pp2@4-7")
    plan = _check_plan(cfg, src, dst, False, 1 << 20)
    sent = plan.sent_by()
    assert sorted(sent) == [0, 1, 2, 3]
    assert max(sent.values()) / min(sent.values()) < 1.02, sent


def test_non_divisor_tp_and_pp():
    cfg = ModelConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=5,
                      num_attention_heads=6, num_key_value_heads=6, attention_bias=True, model_type="qwen2")
    plan = _check_plan(cfg, Placement.parse("dp1tp3pp3@0-8"), Placement.parse("dp2tp2pp2@4-11"), False, 1000)
    # tp3 -> tp2: the middle source chunk of q_proj feeds both destination chunks
    q = [t for t in plan.transfers if t.name == "model.layers.0.self_attn.q_proj.weight"]
    assert {t.region[0] for t in q} >= {(16, 24), (24, 32)}


def test_chop_bounds_pieces_and_keeps_rows_whole():
    assert chop(((0, 10), (0, 4)), 8) == [((a, min(a + 2, 10)), (0, 4)) for a in range(0, 10, 2)]
    want = [((r, r + 1), (c, min(c + 4, 10))) for r in range(2) for c in (0, 4, 8)]
    assert chop(((0, 2), (0, 10)), 4) == want
    assert chop(((3, 5),), 100) == [((3, 5),)]


def test_different_models_are_refused():
    a = shard_map(get_preset("tiny"), Placement.parse("dp1tp1pp1@0"))
    b = shard_map(get_preset("tiny").replace(num_hidden_layers=4), Placement.parse("dp1tp1pp1@0"))
    with pytest.raises(ValueError, match="different models"):
        realloc_plan(a, b)


def test_link_bytes_for_70b_on_128_ranks_counts_the_missing_half():
    cfg = get_preset("llama2-70b")
    lb = link_bytes(cfg, Placement.parse("dp8tp8pp2@0-127"), Placement.parse("dp16tp8pp1@0-127"))
    # Each of the 128 destination ranks needs 1/8 of the matrices plus every norm (replicated over
    # TP), and already holds the half of that on its own source stage; 2 bytes per element.
    norms = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size
    need = (num_params(cfg) - norms) // 8 + norms
    assert sum(lb.values()) == 128 * need // 2 * 2
    # the 8 dp replicas of a source stage share each destination's load evenly
    assert len({v for (s, d), v in lb.items() if d == 64 and v > 10**8}) == 1
