"""Bad input gets one clear message and exit status 2 before any rank starts; the pure axis math
that the group cache relies on is checked without any process group."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshrl import cli
from meshrl.commands.check import default_placements, layouts_of_size
from meshrl.model.presets import get_preset
from meshrl.parallel.groups import all_axes
from meshrl.layout.mesh import Layout, LayoutError, Mesh, Placement
from meshrl.layout.shardmap import check_shardable


@pytest.fixture
def no_ranks(monkeypatch):
    """Fail the test if anything tries to start ranks."""
    import meshrl.runtime.launch as launch

    def refuse(*a, **k):
        raise AssertionError("ranks were started for bad input")
    monkeypatch.setattr(launch, "RankPool", refuse)


@pytest.mark.parametrize("argv, message", [
    (["--nprocs", "4", "--layout", "dp2tp2pp1@0-2"], "layout dp2tp2pp1 has 4 ranks but mesh 0-2 has 3"),
    (["--nprocs", "4", "--layout", "dp1tp3pp1@0-2"], "tp=3 does not divide the model's attention heads (8)"),
    (["--nprocs", "16", "--layout", "dp1tp1pp16@0-15"], "pp=16 is larger than the model's 8 layers"),
    (["--nprocs", "4", "--layout", "dp2tp1pp1@6-7"], "mesh 6-7 has ranks [6, 7] outside the world of 4 ranks"),
    (["--nprocs", "0"], "--nprocs must be >= 1"),
    (["--nprocs", "2", "--model", "no-such-model"], "no-such-model"),
    (["--nprocs", "2", "--layout", "dp2xx@0-1"], "cannot parse layout 'dp2xx'"),
])
def test_check_parallel_rejects_bad_input_before_starting_ranks(no_ranks, capsys, argv, message):
    assert cli.main(["check", "parallel", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("meshrl check: error: ")
    assert message in err
    assert len(err.splitlines()) == 1


def test_parallel_model_rejects_unshardable_layout_before_making_groups():
    # ParallelModel.create validates with the ShardMap before touching torch.distributed.
    from meshrl.parallel.groups import GroupCache
    from meshrl.parallel.model import ParallelModel

    with pytest.raises(LayoutError, match="tp=3 does not divide"):
        ParallelModel.create(get_preset("tiny"), Placement.parse("dp1tp3pp1@0-2"), GroupCache(), None)


def test_default_placements_cover_the_issue_list():
    four = default_placements(4)
    for want in ("dp4tp1pp1@0-3", "dp1tp4pp1@0-3", "dp1tp1pp4@0-3", "dp2tp2pp1@0-3", "dp2tp1pp2@0-3",
                 "dp1tp2pp2@0-3"):
        assert want in four
    assert any(not p.endswith("@0-3") for p in four)  # a sub-mesh that does not start at rank 0
    assert len(layouts_of_size(8)) == 10 and len(layouts_of_size(1)) == 1


@given(dp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       start=st.integers(0, 5), kv=st.sampled_from([1, 2, 4, 8]))
def test_axes_partition_the_mesh(dp, tp, pp, start, kv):
    placement = Placement(Mesh.range(start, dp * tp * pp), Layout(dp, tp, pp))
    axes = all_axes(placement, kv)
    ranks = set(placement.mesh.ranks)
    for kind in ("dp", "tp", "pp", "mp", "kv"):
        flat = [r for g in axes[kind] for r in g]
        assert sorted(flat) == sorted(ranks), kind  # every rank in exactly one group per axis
    for g in axes["kv"]:  # the ranks sharing a KV head hold the same k/v slice
        coords = [placement.coords_of(r) for r in g]
        assert len({(c[0], c[2]) for c in coords}) == 1
        assert len({c[1] // max(tp // kv, 1) for c in coords}) == 1
    for g in axes["mp"]:
        assert len({placement.coords_of(r)[0] for r in g}) == 1  # one dp replica
    assert len(axes["tied"]) == (dp * tp if pp > 1 else 0)


def test_shardmap_validation_messages():
    tiny = get_preset("tiny")
    with pytest.raises(LayoutError, match="pp=9 is larger"):
        check_shardable(tiny, Placement.parse("dp1tp1pp9@0-8"))
    with pytest.raises(LayoutError, match="vocabulary size"):
        check_shardable(tiny.replace(vocab_size=257), Placement.parse("dp1tp2pp1@0-1"))


def test_summary_fails_on_a_large_difference_or_different_tokens():
    from meshrl.parallel.verify import TOLERANCE, summarize

    good = {"logits": 1e-7, "logprobs": 1e-7, "grads": 1e-6, "params": 1e-6, "loss": 1e-7, "grad_norm": 1e-7,
            "full_state": 1e-6, "generate_equal": True, "sample_equal": True}
    r2, r3 = {**good, "rank": 2}, {**good, "rank": 3}
    assert summarize("dp2tp1pp1@2-3", [None, None, r2, r3])["ok"]
    rec = summarize("dp2tp1pp1@2-3", [None, None, r2, {**r3, "grads": 10 * TOLERANCE}])
    assert not rec["ok"] and rec["ranks"] == [2, 3] and rec["grads_max_rel_diff"] == 10 * TOLERANCE
    assert not summarize("dp2tp1pp1@2-3", [None, None, r2, {**r3, "generate_equal": False}])["ok"]


def test_summary_fails_when_evidence_is_missing():
    """A check must fail when a rank did not report (issue 18, item 10): not max(..., default=0)."""
    from meshrl.layout.mesh import Placement
    from meshrl.parallel.verify import summarize

    full = {"logits": 1e-7, "logprobs": 1e-7, "grads": 1e-6, "params": 1e-6, "loss": 1e-7, "grad_norm": 1e-7,
            "generate_equal": True, "sample_equal": True}
    ranks = [{**full, "rank": r, **({"full_state": 1e-6} if r == 0 else {})} for r in range(4)]
    assert summarize("dp2tp1pp2@0-3", ranks)["ok"]
    rec = summarize("dp2tp1pp2@0-3", [None] * 4)
    assert not rec["ok"] and "rank 0: no result" in rec["missing"]
    assert not summarize("dp2tp1pp2@0-3", ranks[:3] + [None])["ok"]  # one rank silent
    no_params = [ranks[0], ranks[1], {k: v for k, v in ranks[2].items() if k != "params"}, ranks[3]]
    assert summarize("dp2tp1pp2@0-3", no_params)["missing"] == ["rank 2: no params"]
    # the last pipeline stage (pp index 1) must report logits; the first need not
    last = [r for r in range(4) if Placement.parse("dp2tp1pp2@0-3").coords_of(r)[2] == 1][0]
    no_logits = [{k: v for k, v in r.items() if not (r["rank"] == last and k == "logits")} for r in ranks]
    assert not summarize("dp2tp1pp2@0-3", no_logits)["ok"]
    assert not summarize("dp2tp1pp2@0-3", [ranks[0], {**ranks[1], "loss": float("nan")}, *ranks[2:]])["ok"]
    no_full = [{k: v for k, v in r.items() if k != "full_state"} for r in ranks]
    assert summarize("dp2tp1pp2@0-3", no_full)["missing"] == ["no rank: full_state"]
