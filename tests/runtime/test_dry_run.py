"""The dry run (meshrl/runtime/dry_run.py): the real runtime on fake tensors and fake process groups.

Oracles: the symmetry reduction against simulating every rank; the estimator's weights and
optimizer state against the bytes the fake ranks hold; injected bugs (a collective of the wrong
shape on one rank, a whole weight on one rank of a tp layout, full-vocabulary logits) against the
audit and the whole-tensor check, which must name them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest
import torch

from meshrl.algo.graph import graph_for
from meshrl.config import load_config
from meshrl.layout.mesh import Layout, Mesh
from meshrl.model.config import param_shapes
from meshrl.plan.execution_plan import CallPlan, Cluster, ExecutionPlan
from meshrl.plan.problem import problem_from_config
from meshrl.layout.mesh import Placement
from meshrl.layout.shardmap import shard_map
from meshrl.model.presets import get_preset
from meshrl.runtime.dry_run import dry_run, sharded_weights

SIZES = ["data.batch_size=8", "data.gen_len=4", "data.prompt_len=8", "cluster.device=h100-80g"]


def _setup(n: int, layout: str, extra: tuple[str, ...] = ()):
    cfg = load_config(None, [*SIZES, f"cluster.devices_per_node={n}", *extra])
    prob = problem_from_config(cfg)
    calls = {c.name: CallPlan(Mesh.range(0, n), Layout.parse(layout), 1)
             for c in graph_for(cfg.algo, cfg.data.samples_per_prompt).calls}
    return cfg, prob, ExecutionPlan(Cluster(1, n), calls, layout)


def _peaks(res) -> dict[tuple[str, int], float]:
    return {(c, r): res.measured(c, r) for c, per in res.predicted.items() for r in per}


@pytest.mark.timeout(900)
def test_symmetry_classes_give_every_rank_s_numbers():
    """tp4 on 4 ranks: the classes' simulated ranks stand for the others exactly."""
    cfg, prob, plan = _setup(4, "dp1tp4pp1")
    every = dry_run(cfg, prob, plan, every_rank=True)
    reduced = dry_run(cfg, prob, plan)
    assert every.failures == [] and reduced.failures == []
    assert len(reduced.simulated) < 4
    assert _peaks(every) == _peaks(reduced)
    assert every.checked > reduced.checked > 0  # tp all-reduces compared across members
    # resident bytes at the first call: the estimator's weights + ZeRO-1 state of the homes (an
    # independent count: bf16 shards, fp32 master + m + v over dp), to within the small tensors
    # (the estimator divides every parameter by tp; the norms, replicated, are 6% of this tiny model)
    first = every.runs[0].steps[0]
    home = {prob.home(plan, role) for role in prob.graph.roles() if role not in prob.weightless}
    want = sum(prob.call_estimate(h, plan.calls[h]).weights_bytes + prob.call_estimate(h, plan.calls[h]).state_bytes
               for h in home)
    assert abs(first.start - want) / want < 0.08, (first.start, want)


@pytest.mark.timeout(900)
def test_a_collective_of_the_wrong_shape_on_one_rank_is_named(monkeypatch):
    """Rank 1's gradient all-reduces lose a column: the audit names the step, the ranks and shapes."""
    from meshrl.parallel import comm

    cfg, prob, plan = _setup(2, "dp2tp1pp1")
    real = comm.all_reduce

    def broken(t, group, op=torch.distributed.ReduceOp.SUM, async_op=False):
        if torch.distributed.get_rank() == 1 and t.dim() == 1 and t.numel() > 1:
            t = t[:-1]
        return real(t, group, op, async_op)

    monkeypatch.setattr(comm, "all_reduce", broken)
    res = dry_run(cfg, prob, plan, every_rank=True)
    assert res.mismatched, res.failures
    m = res.mismatched[0]
    assert m.ranks == (0, 1) and "actor_train" in m.step
    n = int(m.first.split("[")[1].split("]")[0])
    assert f"[{n}]" in m.first and f"[{n - 1}]" in m.second
    assert any("disagree on collective" in f and "actor_train" in f for f in res.failures)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "mixtral"])
def test_the_weights_checked_for_wholeness_are_those_the_shard_map_splits(family):
    """The whole-weight check's list against ShardMap under tp2: a 2-D weight is listed exactly when
    no rank holds it whole (Mixtral's router, ``block_sparse_moe.gate``, is replicated as Qwen3's is)."""
    extra = {"llama": dict(num_experts=0), "mixtral": dict(intermediate_size=64)}.get(family, {})
    cfg = get_preset("tiny-moe").replace(model_type=family, **extra)
    sm = shard_map(cfg, Placement.parse("dp1tp2pp1@0-1"))
    split = {n for n, shape in sm.shapes.items() if len(shape) == 2
             and all(sl != tuple((0, d) for d in shape) for _, sl in sm.holders(n))}
    whole_experts = {n for n in sm.shapes if ".experts." in n}  # whole experts, spread over tp
    assert set(sharded_weights(cfg, False)) == split - whole_experts
    assert any(n.endswith("gate.weight") and ".experts." not in n for n in sm.shapes) == (family != "llama")


@pytest.mark.timeout(900)
def test_a_whole_weight_on_one_rank_fails_with_its_name_and_size(monkeypatch):
    """A loader that ignores the slice on rank 1 (it gets the whole gate projection under tp2)."""
    from meshrl.parallel.stage import Stage

    cfg, prob, plan = _setup(2, "dp1tp2pp1")
    target = "model.layers.0.mlp.gate_proj.weight"
    shape = param_shapes(prob.models["actor"])[target]
    real = Stage._place

    def place(self, name, tensor):
        if name == target and self.groups.rank == 1:
            tensor = torch.empty(shape, dtype=tensor.dtype)
        return real(self, name, tensor)

    monkeypatch.setattr(Stage, "_place", place)
    res = dry_run(cfg, prob, plan, every_rank=True)
    hits = [f for f in res.failures if target in f and "whole" in f]
    assert hits, res.failures
    assert str(list(shape)) in hits[0] and "MiB" in hits[0] and hits[0].startswith("rank 1")


@pytest.mark.timeout(900)
def test_full_vocabulary_logits_on_a_tp_rank_fail_with_the_tensor(monkeypatch):
    """Gathering the vocabulary-sharded logits whole before the log-softmax (a classic tp bug)."""
    import meshrl.parallel.model as pmodel

    cfg, prob, plan = _setup(2, "dp1tp2pp1")
    real = pmodel.vocab_parallel_logprobs

    def gathering(logits, targets, tp, start, entropy=False):
        torch.cat([logits] * tp.size, dim=-1)  # the whole vocabulary on this rank
        return real(logits, targets, tp, start, entropy)

    monkeypatch.setattr(pmodel, "vocab_parallel_logprobs", gathering)
    res = dry_run(cfg, prob, plan, every_rank=True)
    vocab = prob.models["actor"].vocab_size
    hits = [f for f in res.failures if "full-vocabulary" in f]
    assert hits and f", {vocab}]" in hits[0] and "MiB" in hits[0]


@pytest.mark.timeout(900)
def test_a_pipeline_and_transfers_between_meshes():
    """Generation on ranks 0-1 (pp2), the rest on 2-3: pipeline sends, reallocation, transfers."""
    cfg = load_config(None, [*SIZES, "cluster.devices_per_node=4"])
    prob = problem_from_config(cfg)
    calls = {}
    for c in graph_for(cfg.algo, cfg.data.samples_per_prompt).calls:
        mesh, lay = (Mesh.range(0, 2), Layout(1, 1, 2)) if c.kind == "generate" else (Mesh.range(2, 2), Layout(2, 1, 1))
        calls[c.name] = CallPlan(mesh, lay, 2 if c.kind == "generate" else 1)
    plan = ExecutionPlan(Cluster(1, 4), calls, "split")
    res = dry_run(cfg, prob, plan)
    assert res.failures == []
    kinds = {op.kind for run in res.runs.values() for op in run.ledger.ops}
    assert {"send", "recv", "all_reduce"} <= kinds
    steps = {s.kind for s in res.runs[2].steps}
    assert {"realloc", "transfer", "call"} <= steps


@pytest.mark.timeout(900)
def test_plan_dry_run_json():
    """The CLI contract: meshrl plan ... --dry-run --json."""
    out = subprocess.run([sys.executable, "-m", "meshrl.cli", "plan", *SIZES, "cluster.devices_per_node=2",
                          "--strategy", "colocated", "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got) >= {"calls", "collectives", "seconds"}
    assert set(got["collectives"]) >= {"checked", "mismatched"} and got["collectives"]["mismatched"] == []
    for c in got["calls"].values():
        assert c["predicted_mem_gib"] > 0 and c["dry_run_mem_gib"] > 0 and len(c["ranks"]) == 2


@pytest.mark.timeout(1200)
def test_a_7b_plan_on_8_fake_ranks():
    """PPO with four 7B models on 8 H100s (the colocated plan): runs, fits, matches the estimator."""
    from meshrl.plan.strategies import BUILDERS

    cfg = load_config(None, ["cluster.device=h100-80g", "cluster.devices_per_node=8"] +
                      [f"models.{r}=llama2-7b" for r in ("actor", "ref", "critic", "reward")])
    prob = problem_from_config(cfg)
    plan = BUILDERS["colocated"](prob)
    res = dry_run(cfg, prob, plan)
    assert res.failures == []
    errs = [abs(p - res.measured(c, r)) / res.measured(c, r)
            for c, per in res.predicted.items() for r, p in per.items() if r in res.simulated]
    assert statistics.median(errs) <= 0.10 and max(errs) <= 0.25, errs
    assert max(res.measured(c, r) for c, per in res.predicted.items() for r in per) < prob.hw.mem_bytes


@pytest.mark.timeout(900)
def test_the_steps_the_dry_run_skips_change_no_peak():
    """decode='ends' (the first two of a train call's four optimizer steps, the first and last two
    of each decoding loop) against every step executed: the same peak per call and rank."""
    cfg, prob, plan = _setup(2, "dp2tp1pp1", ("ppo.mini_batches=4", "data.gen_len=8"))
    ends, every = dry_run(cfg, prob, plan, decode="ends"), dry_run(cfg, prob, plan, decode="all")
    assert ends.failures == [] and every.failures == []
    assert _peaks(ends) == _peaks(every)
    assert every.checked > ends.checked  # the skipped steps' collectives


@pytest.mark.timeout(900)
def test_the_micro_batches_the_dry_run_skips_change_no_peak():
    """Generation at pp2 with 4 micro-batches in flight (ranks 0-1), the rest at pp2 on ranks 2-3
    with 4 micro-batches: decode='ends' prefills all four generation micro-batches and runs the decoding
    passes of the first two, and trains on max(pp, 2) = 2 micro-batches (1F1B's most in flight),
    with the same peaks per call and rank as every pass executed (among them the prefills' hidden
    states that stage 0 holds until their sends complete)."""
    cfg = load_config(None, [*SIZES, "cluster.devices_per_node=4", "data.gen_len=8"])
    prob = problem_from_config(cfg)
    calls = {}
    for c in graph_for(cfg.algo, cfg.data.samples_per_prompt).calls:
        mesh = Mesh.range(0 if c.kind == "generate" else 2, 2)
        calls[c.name] = CallPlan(mesh, Layout(1, 1, 2), 4 if c.kind in ("generate", "train") else 1)
    plan = ExecutionPlan(Cluster(1, 4), calls, "split")
    ends, every = dry_run(cfg, prob, plan, decode="ends"), dry_run(cfg, prob, plan, decode="all")
    assert ends.failures == [] and every.failures == []
    assert _peaks(ends) == _peaks(every)
    sends = [sum(op.kind == "send" for op in r.ledger.ops) for r in (ends.runs[0], every.runs[0])]
    assert sends[0] < sends[1]  # fewer passes went down the pipe
    sends = [sum(op.kind == "send" for op in r.ledger.ops) for r in (ends.runs[2], every.runs[2])]
    assert sends[0] < sends[1]  # and fewer train micro-batches


@pytest.mark.timeout(900)
def test_ranks_moving_the_same_pieces_in_another_order_are_not_one_class():
    """Generation at tp2pp2 on ranks 2-5 from a tp2 home on ranks 0-1: ranks 2 and 3 receive pieces
    of the same shapes, but each gets the replicated norms partly from the other tp rank, so their
    buckets come in another peer order and their messages in another order. The signature follows
    the executor's rounds, so they are two classes, and the reduced dry run agrees with every rank's."""
    cfg = load_config(None, [*SIZES, "cluster.devices_per_node=6"])
    prob = problem_from_config(cfg)
    calls = {c.name: (CallPlan(Mesh.range(2, 4), Layout(1, 2, 2), 1) if c.kind == "generate"
                      else CallPlan(Mesh.range(0, 2), Layout(1, 2, 1), 1))
             for c in graph_for(cfg.algo, cfg.data.samples_per_prompt).calls}
    plan = ExecutionPlan(Cluster(1, 6), calls, "split")
    reduced = dry_run(cfg, prob, plan)
    assert reduced.failures == []
    every = dry_run(cfg, prob, plan, every_rank=True)
    assert every.failures == [] and _peaks(every) == _peaks(reduced)


def test_the_memory_budget_takes_the_larger_of_a_share_and_a_margin():
    """A call fails above 1.25x its prediction only when that is also 256 MiB or more above it: the
    demo's calls (tens of MiB) keep their few MiB of temporaries, a 10 GiB call may not grow by 3 GiB."""
    from meshrl.runtime.dry_run import budget

    mib = 2**20
    assert budget(80 * mib) == 80 * mib + 256 * mib
    assert budget(10 * 2**30) == 1.25 * 10 * 2**30
    assert budget(1024 * mib) == 1024 * mib + 256 * mib == 1.25 * 1024 * mib


@pytest.mark.timeout(900)
def test_a_plan_for_a_checkpoint_of_ones_own_dry_runs_without_reading_it(tmp_path):
    """models.actor.path: the dry run builds its shards from the checkpoint's shapes (checked against
    the files when the loader opens them) on fake tensors, reading no weight; the peaks equal those
    of the same model as a preset, whose weights are drawn instead."""
    from meshrl.cli import main

    assert main(["train", "algo=sft", "train.iterations=1", "data.batch_size=4", "--out", str(tmp_path / "sft"),
                 "--no-progress"]) == 0
    cfg, prob, plan = _setup(2, "dp1tp2pp1", ("algo=grpo",))
    mine = load_config(None, [*SIZES, "cluster.devices_per_node=2", "algo=grpo",
                              f"models.actor.path={tmp_path / 'sft' / 'actor'}"])
    preset, own = dry_run(cfg, prob, plan), dry_run(mine, problem_from_config(mine), plan)
    assert preset.failures == [] and own.failures == [], own.failures
    assert _peaks(own) == _peaks(preset)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype,native", [("auto", None), ("bfloat16", False), ("bfloat16", True)])
def test_the_demo_without_a_profile_is_priced_as_it_runs(tmp_path, monkeypatch, dtype, native):
    """A CPU plan without a measured profile takes the GPU preset's costs (plan/fallback.py), but its
    memory is the run's: the dtype the CPU resolves (float32 where bf16 is emulated; a GPU would take
    bf16) and the CPU code paths' copies (decoding's packed or fused weights). Every call of the demo
    is then within 10% of its dry-run peak (pricing in the stand-in's bf16 put the float32 training
    calls 25% below; leaving out decoding's packed copies, generation 11% above). What remains is
    the estimator's bound for one rank alone: a train call's gradients and all its activations at
    once, where the backward makes the one as it frees the other (about 6% here). ``native``: bf16
    on a CPU with (True) or without bf16 dot products, whose decoding packs every projection or
    fuses two pairs of them."""
    from meshrl import cpu_features
    from meshrl.plan.fallback import planning_problem

    if native is not None:
        monkeypatch.setattr(cpu_features, "native_bf16", lambda *a: native)
    monkeypatch.setenv("MESHRL_PROFILE", str(tmp_path / "no-profile.json"))
    cfg = load_config(None, [f"train.dtype={dtype}"])
    prob, note = planning_problem(cfg)
    assert note and prob.hw.cpu
    calls = {c.name: CallPlan(Mesh.range(0, 1), Layout(1, 1, 1), 1) for c in graph_for(cfg.algo).calls}
    res = dry_run(cfg, prob, ExecutionPlan(Cluster(1, 1), calls, "colocated"))
    assert res.failures == []
    errs = {c: abs(p[0] - res.measured(c, 0)) / res.measured(c, 0) for c, p in res.predicted.items()}
    assert max(errs.values()) <= 0.10, errs


@pytest.mark.timeout(900)
def test_each_pipeline_stage_is_priced_with_its_own_weights():
    """A model whose embedding outweighs a stage's layers (qwen2.5-0.5b, tied: the first stage holds
    the embedding, the last its copy as the head, the middle ones neither), pp4 for every call: the
    estimator's per-rank peak matches the dry run's on every stage, the middle ones too (priced as
    the first, they were over-predicted by the embedding of every model and its optimizer state)."""
    models = [f"models.{r}=qwen2.5-0.5b" for r in ("actor", "ref", "critic", "reward")]
    cfg, prob, plan = _setup(4, "dp1tp1pp4", tuple(models))
    res = dry_run(cfg, prob, plan, every_rank=True)
    assert res.failures == []
    errs = {(c, r): abs(p - res.measured(c, r)) / res.measured(c, r)
            for c, per in res.predicted.items() for r, p in per.items()}
    assert max(errs.values()) <= 0.05, sorted(errs.items(), key=lambda kv: -kv[1])[:4]
    stage0, middle = res.measured("actor_train", 0), res.measured("actor_train", 1)
    assert middle < 0.7 * stage0  # the test can tell the stages apart
