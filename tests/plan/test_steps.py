"""The global step order (meshrl/plan/steps.py, pure): the one list the runtime walks and the
simulator prices. Every input is delivered before its call, outputs are handed on at once, the
shadow actor is refreshed, off-policy generation runs one iteration ahead, resume skips what a
checkpoint holds."""

from __future__ import annotations

import pytest

from meshrl.algo.graph import graph_for
from meshrl.config import load_config
from meshrl.layout.mesh import Placement
from meshrl.plan.execution_plan import CallPlan, Cluster, ExecutionPlan
from meshrl.plan.problem import problem_from_config
from meshrl.plan.strategies import build
from meshrl.plan.steps import generated_ahead, steps, temporary

from runtime.runtime_util import random_plan


def _problem(algo: str, off_policy: int = 0):
    cfg = load_config(None, [f"algo={algo}", "cluster.devices_per_node=4", "cluster.device=a100-80g",
                             "data.batch_size=8"] + (["data.samples_per_prompt=2"] if algo == "grpo" else []))
    return cfg, problem_from_config(cfg, off_policy=off_policy)


def test_outputs_are_handed_on_at_once():
    """Interleaved: the critic's inputs from the actor's ranks move before the actor trains, so the
    two training calls can run side by side (sent just before critic_train, they would wait for it)."""
    _, problem = _problem("ppo")
    plan = build(problem, "interleaved")
    names = [(s.name, s.iteration) for s in steps(problem.graph, plan, 0, 1)]
    ref_to_critic = names.index(("transfer ref_inf->critic_train", 0))
    assert names.index(("ref_inf", 0)) < ref_to_critic < names.index(("actor_train", 0))


def test_disaggregated_refreshes_the_shadow_actor_every_iteration():
    _, problem = _problem("ppo")
    plan = build(problem, "disaggregated")
    names = [(s.name, s.iteration) for s in steps(problem.graph, plan, 0, 2)]
    for t in (0, 1):
        assert names.index(("realloc actor->actor_gen", t)) + 1 == names.index(("actor_gen", t))
    assert names.index(("actor_train", 0)) < names.index(("realloc actor->actor_gen", 1))


def test_async_generation_runs_one_iteration_ahead():
    _, problem = _problem("ppo", off_policy=1)
    plan = build(problem, "disaggregated")
    names = [(s.name, s.iteration) for s in steps(problem.graph, plan, 0, 3, off_policy=1)]
    assert names.index(("actor_gen", 1)) < names.index(("actor_train", 0))
    assert names.index(("actor_gen", 2)) < names.index(("actor_train", 1))
    assert ("actor_gen", 3) not in names


def test_resume_after_an_async_checkpoint_skips_the_generation_made_ahead():
    """Resuming at iteration 1 from the checkpoint of 0 (which holds iteration 1's batch): the run
    continues with exactly the steps the uninterrupted run had after the end of iteration 0."""
    _, problem = _problem("ppo", off_policy=1)
    plan = build(problem, "disaggregated")
    whole = steps(problem.graph, plan, 0, 3, 1)
    after = whole[whole.index(next(s for s in whole if s.kind == "end" and s.iteration == 0)) + 1:]
    assert steps(problem.graph, plan, 1, 3, 1, ahead=True) == after
    assert steps(problem.graph, plan, 1, 3, 1)[:2] != after[:2]  # without ahead it generates 1 again
    with pytest.raises(ValueError, match="only an off-policy run"):
        steps(problem.graph, plan, 1, 3, 0, ahead=True)


@pytest.mark.parametrize("k", [2, 4])
def test_k_steps_off_policy_generates_k_iterations_ahead(k):
    """train.off_policy=k: generation of t+k comes before iteration t's training, so it reads the
    weights of k updates earlier; the first k generations come first, none past the last iteration."""
    _, problem = _problem("ppo", off_policy=k)
    plan = build(problem, "disaggregated")
    n = k + 3
    names = [(s.name, s.iteration) for s in steps(problem.graph, plan, 0, n, off_policy=k)]
    first_train = names.index(("actor_train", 0))
    assert all(names.index(("actor_gen", j)) < first_train for j in range(k + 1))
    for t in range(n - k):
        assert names.index(("actor_gen", t + k)) < names.index(("actor_train", t))
        if t:  # and after the update before it: k updates old, not more
            assert names.index(("actor_train", t - 1)) < names.index(("actor_gen", t + k))
    assert sorted(j for name, j in names if name == "actor_gen") == list(range(n))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_resume_skips_every_generation_made_ahead(k):
    """Resuming at iteration 2 from the checkpoint of 1 (which holds the batches of 2 .. 1+k): the
    run continues with exactly the steps the uninterrupted run had after the end of iteration 1."""
    _, problem = _problem("ppo", off_policy=k)
    plan = build(problem, "disaggregated")
    whole = steps(problem.graph, plan, 0, 6, k)
    after = whole[whole.index(next(s for s in whole if s.kind == "end" and s.iteration == 1)) + 1:]
    assert steps(problem.graph, plan, 2, 6, k, ahead=k) == after
    assert generated_ahead(k, 1, 6) == list(range(2, 2 + k))
    with pytest.raises(ValueError, match="at most"):
        steps(problem.graph, plan, 2, 6, k, ahead=k + 1)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_rank_of_a_call_has_its_inputs_first(algo):
    """Replaying the transfers: each rank of a call has every parent's whole output before it runs,
    and only the holders of a producer's dp replicas send."""
    cfg, _ = _problem(algo)
    graph = graph_for(cfg.algo, cfg.data.samples_per_prompt)
    for seed in range(40):
        plan = random_plan(load_config(None, ["algo=" + algo, "data.batch_size=8"]
                                       + (["data.samples_per_prompt=2"] if algo == "grpo" else [])), seed)
        have: dict[tuple[str, int], set[int]] = {}
        for s in steps(graph, plan, 0, 2):
            if s.kind == "transfer":
                assert s.senders == plan.calls[s.src_call].placement.holders()
                assert set(s.receivers) <= set(plan.calls[s.call].mesh.ranks)
                have.setdefault((s.src_call, s.iteration), set()).update(s.receivers)
            if s.kind == "call":
                for p in graph.parents(s.call):
                    missing = set(s.ranks) - have.get((p, s.iteration), set())
                    assert not missing, f"seed {seed}: {s.call} runs on {sorted(missing)} without {p}'s output"


def test_which_copies_are_temporary():
    """A copy is dropped after its call unless it is the home, a shadow actor (generation on ranks
    the home does not use) or kept by the plan; the runtime builds only the others at the start."""
    graph = graph_for("ppo", 1)

    def plan(keep: bool = False, **where: str) -> ExecutionPlan:
        at = {c.name: "dp1tp2pp1@0-1" for c in graph.calls} | where
        calls = {n: CallPlan(Placement.parse(s).mesh, Placement.parse(s).layout, 1) for n, s in at.items()}
        return ExecutionPlan(Cluster(1, 4), calls, "test", keep_copies=keep)

    same = plan()
    assert not any(temporary(graph, same, c.name) for c in graph.calls)  # every call at its role's home
    overlapping = plan(actor_gen="dp2tp1pp1@0-1", critic_inf="dp1tp2pp1@2-3")
    assert temporary(graph, overlapping, "actor_gen") and temporary(graph, overlapping, "critic_inf")
    assert not temporary(graph, overlapping, "actor_train")
    assert not temporary(graph, plan(actor_gen="dp2tp1pp1@2-3"), "actor_gen")  # a shadow actor stays
    assert not temporary(graph, plan(True, actor_gen="dp2tp1pp1@0-1"), "actor_gen")  # keep_copies
