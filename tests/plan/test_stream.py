"""The schedule of streaming generation with partial rollouts (meshrl/plan/stream.py, pure), by
hand: admission k versions ahead, S decode steps per version, the finish at the bound, the prologue,
the step order that carries it, and resume from a checkpoint that holds the batches in flight."""

from __future__ import annotations

import pytest

from meshrl.plan.steps import generated_ahead, steps
from meshrl.plan.strategies import build
from meshrl.plan.stream import Segment, advance, prologue, token_budget

from plan.test_steps import _problem


def test_version_t_finishes_t_plus_1_and_advances_the_rest():
    """k = 3, S = 2: at version 5 batch 6 (steps 0-1 at version 3, 2-3 at 4) is finished, batch 7
    (steps 0-1 at 4) gets steps 2-3, batch 8 is admitted: steps 0-1."""
    assert advance(5, 3, 2, 100) == (Segment(6, 5, 4, None), Segment(7, 5, 2, 2), Segment(8, 5, 0, 2))
    assert advance(5, 3, 2, 8) == (Segment(6, 5, 4, None), Segment(7, 5, 2, 2))  # batch 8 is past the end
    assert advance(5, 1, 2, 100) == (Segment(6, 5, 0, None),)  # k = 1: admitted and finished at once
    assert advance(5, 3, 2, 7) == (Segment(6, 5, 4, None),)
    assert advance(6, 3, 2, 7) == ()


def test_the_prologue_gives_each_batch_the_steps_of_the_versions_before_start():
    """From scratch with k = 3, S = 2: batch 0 whole, batch 1 the steps of versions -2 and -1 (4),
    batch 2 those of version -1 (2), all under version 0; a resume that restored 2 batches makes
    only the third; one that restored all makes none."""
    assert prologue(0, 0, 3, 2, 100) == (Segment(0, 0, 0, None), Segment(1, 0, 0, 4), Segment(2, 0, 0, 2))
    assert prologue(4, 2, 3, 2, 100) == (Segment(6, 4, 0, 2),)
    assert prologue(4, 3, 3, 2, 100) == ()
    assert prologue(0, 0, 3, 2, 2) == (Segment(0, 0, 0, None), Segment(1, 0, 0, 4))


def test_token_budget_stops_at_gen_len():
    assert token_budget(Segment(3, 1, 4, 2), 5) == 1
    assert token_budget(Segment(3, 1, 4, None), 10) == 6
    assert token_budget(Segment(3, 1, 6, 2), 5) == 0


def test_every_batch_gets_its_steps_once_under_versions_within_k():
    """Walking the schedule of 8 iterations (k = 2, S = 3, gen_len 8): each batch's decode steps
    are 0..7 exactly once, each step under a version between j - k and j - 1 (j >= k), so no token
    is more than k versions older than the update that trains on it."""
    k, s, n, stop = 2, 3, 8, 8
    decoded: dict[int, list[tuple[int, int]]] = {}  # batch -> (step, version)
    segs = list(prologue(0, 0, k, s, stop))
    for t in range(stop):
        segs += advance(t, k, s, stop)
    for seg in segs:
        decoded.setdefault(seg.batch, []).extend((seg.first + i, seg.version) for i in range(token_budget(seg, n)))
    assert sorted(decoded) == list(range(stop))
    for j, got in decoded.items():
        assert [step for step, _ in got] == list(range(n)), j
        assert all(max(0, j - k) <= v <= max(0, j - 1) for _, v in got), (j, got)
    assert decoded[5] == [(i, 3) for i in range(3)] + [(i, 4) for i in range(3, 8)]


def _gen_steps(order):
    return [(st.iteration, st.stream) for st in order if st.kind == "call" and st.stream]


def test_the_step_order_runs_one_generation_a_version_after_the_hand_on():
    """Disaggregated, k = 2, S = 2, 4 iterations: the prologue, then version t's generation after t's
    samples are handed on and before t trains (realloc'd first: the new weights), none after t = 2."""
    _, problem = _problem("ppo", off_policy=2)
    plan = build(problem, "disaggregated")
    order = steps(problem.graph, plan, 0, 4, 2, stream_steps=2)
    assert _gen_steps(order) == [(1, prologue(0, 0, 2, 2, 4)), (2, advance(0, 2, 2, 4)), (3, advance(1, 2, 2, 4)),
                                 (3, advance(2, 2, 2, 4))]
    names = [(st.name, st.iteration) for st in order]
    gens = [i for i, st in enumerate(order) if st.stream]
    for t, at in zip(range(3), gens[1:], strict=True):
        assert names.index(("transfer actor_gen->reward_inf", t)) < at < names.index(("actor_train", t))
        assert names[at - 1] == ("realloc actor->actor_gen", order[at].iteration)
        if t:
            assert names.index(("actor_train", t - 1)) < at


@pytest.mark.parametrize("k", [1, 2, 3])
def test_resume_continues_with_the_uninterrupted_steps(k):
    """Resuming at iteration 2 from the checkpoint of 1 (the batches in flight: 2 .. 1 + k): exactly
    the steps the uninterrupted run had after the end of iteration 1."""
    _, problem = _problem("ppo", off_policy=k)
    plan = build(problem, "disaggregated")
    whole = steps(problem.graph, plan, 0, 6, k, stream_steps=2)
    after = whole[whole.index(next(s for s in whole if s.kind == "end" and s.iteration == 1)) + 1:]
    assert steps(problem.graph, plan, 2, 6, k, ahead=len(generated_ahead(k, 1, 6)), stream_steps=2) == after
    assert steps(problem.graph, plan, 2, 6, k, stream_steps=2) != after  # without them: a prologue


@pytest.mark.parametrize("extra, says", [
    ([], "needs train.off_policy=k >= 1"),
    (["train.off_policy=2", "gen.backend=vllm"], "partial rollouts need gen.backend=meshrl"),
    (["train.off_policy=2", "algo=sft"], "algo=sft generates nothing"),
    (["train.off_policy=2", "env.fn=count_env.py:CountEnv"], "multi-turn rollouts (env.fn) are generated whole"),
    (["train.off_policy=2", "train.stream_steps=-1"], "train.stream_steps=-1 must be a whole number >= 0 or auto"),
])
def test_settings_streaming_cannot_run_are_refused_naming_the_key(extra, says):
    from meshrl.config import load_config
    from meshrl.errors import UserError

    with pytest.raises(UserError, match="train.stream_steps") as e:
        load_config(None, ["train.stream_steps=2", *extra])
    assert says in str(e.value)


def test_auto_streams_where_a_lag_of_two_or_more_can_stream():
    """train.stream_steps=auto (the default): S = ceil(gen_len / k) at k >= 2 on meshrl's engine in
    single-turn RL, whole batches otherwise; an explicit S is kept; at k = 0 nothing streams."""
    from meshrl.config import load_config
    from meshrl.plan.lag import with_lag

    cfg = load_config(None, ["data.gen_len=16"])
    assert cfg.train.stream_steps == "auto"
    assert [cfg.stream_steps_at(k) for k in (0, 1, 2, 3, 4)] == [0, 0, 8, 6, 4]
    for other in (["gen.backend=vllm"], ["env.fn=count_env.py:CountEnv"]):
        assert load_config(None, ["data.gen_len=16", *other]).stream_steps_at(2) == 0
    assert load_config(None, ["train.off_policy=2", "train.stream_steps=0"]).stream_steps_at(2) == 0
    fixed = load_config(None, ["train.off_policy=auto", "train.stream_steps=3"])
    assert fixed.stream_steps_at(2) == 3 and fixed.stream_steps_at(0) == 0
    assert with_lag(fixed, 0).train.stream_steps == 0 and with_lag(fixed, 2).train.stream_steps == 3
    with pytest.raises(Exception, match="train.stream_steps='often' must be a whole number >= 0 or auto"):
        load_config(None, ["train.stream_steps=often"])
