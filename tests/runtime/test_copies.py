"""Temporary copies (DESIGN.md, "How a plan runs"): a role's copy in another call's layout is dropped
after its call and rebuilt by reallocation before the next, unless the plan says ``keep_copies``.
Either way the results are the same; the test also checks that copies were really dropped (and,
with ``keep_copies``, never). Likewise ``offload_frozen`` (frozen roles in host memory between
uses) changes nothing but where the parameters wait."""

from __future__ import annotations

import dataclasses

import torch

from meshrl.config import load_config
from meshrl.layout.mesh import Placement
from meshrl.plan.execution_plan import CallPlan, Cluster, ExecutionPlan
from meshrl.observe.metrics import deterministic_part
from meshrl.runtime.engine import Engine
from meshrl.runtime.launch import RankPool
from meshrl.runtime.report import record_of
from meshrl.runtime.run import make_groups, model_configs, plan_groups, process_cache
from runtime_util import WORLD, random_plan
from test_plans_equal import COMMON, CONFIGS, assert_same

TIMEOUT = 120.0


def run_counting(cfg, plan) -> tuple[list[dict] | None, int, int]:
    """Run ``plan`` on this rank; (rank 0's metrics records, copies this rank dropped, models it
    offloaded). With ``offload_frozen`` it checks that the frozen models it ended with wait in host
    memory and that ``reload`` brings them back to their device."""
    torch.set_num_threads(1)
    kv = {m.num_key_value_heads for m in model_configs(cfg)}
    make_groups(process_cache(TIMEOUT), plan_groups(plan, kv))
    engine = Engine(cfg, plan, process_cache(TIMEOUT), TIMEOUT, lambda _: None)
    records: list[dict] = []
    for it in engine.iterate(0, cfg.train.iterations):
        if it.logs is not None:
            records.append(record_of(it.iteration, it.logs, 0.0))
    for rm in engine.roles.values():
        for pl, device in dict(rm.offloaded).items():
            assert all(p.device.type == "cpu" for p in rm.models[pl].named.values())
            rm.reload()
            assert all(p.device == device for p in rm.models[pl].named.values())
    return ((records if engine.rank == 0 else None), sum(rm.drops for rm in engine.roles.values()),
            sum(rm.offloads for rm in engine.roles.values()))


def test_dropping_copies_and_offloading_change_nothing_but_memory():
    cfg = load_config(None, CONFIGS["ppo"] + COMMON + ["train.iterations=2", "sft.warmup=false"])
    plan = random_plan(cfg, 1)
    got = {}
    with RankPool(WORLD, timeout=300) as pool:
        for keep, offload in ((False, False), (True, False), (False, True)):
            out = pool.run(run_counting, cfg, dataclasses.replace(plan, keep_copies=keep, offload_frozen=offload))
            got[keep, offload] = (out[0][0], sum(o[1] for o in out), sum(o[2] for o in out))
    assert got[False, False][1] > 0, "the plan has copies, yet none was dropped"
    assert got[True, False][1] == 0, "keep_copies: a copy was dropped"
    assert got[False, False][2] == 0 and got[False, True][2] > 0, "offload_frozen did not (only) offload"
    worst = assert_same(got[True, False][0], got[False, False][0], "keep_copies true vs false")
    worst_off = assert_same(got[False, False][0], got[False, True][0], "offload_frozen true vs false")
    print(f"dropped {got[False, False][1]} copies, offloaded {got[False, True][2]} times over {WORLD} ranks; "
          f"worst scaled diff {worst:.1e} (keep_copies), {worst_off:.1e} (offload_frozen)")


# Temporary copies of both kinds: actor_gen on the actor's home ranks in another layout, critic_inf on
# ranks the critic's home does not use (there the role's dtype comes from no model of its own).
COPIES = {"actor_train": "dp1tp2pp1@0-1", "actor_gen": "dp2tp1pp1@0-1", "ref_inf": "dp1tp1pp2@2-3",
          "reward_inf": "dp2tp1pp1@2-3", "critic_train": "dp1tp1pp2@2-3", "critic_inf": "dp1tp2pp1@0-1"}
# A shadow actor (generation on devices of its own): it stays, so it is built with the home.
SHADOW = {**COPIES, "actor_gen": "dp2tp1pp1@2-3"}


def plan_of(calls: dict[str, str], keep: bool = False) -> ExecutionPlan:
    cps = {n: CallPlan(pl.mesh, pl.layout, 1) for n, pl in ((n, Placement.parse(s)) for n, s in calls.items())}
    return ExecutionPlan(Cluster(1, WORLD), cps, "copies", keep_copies=keep)


def built_then_run(cfg, plan, iterations: int):
    """(this rank's {role: (placements built, placements dropped)} right after the engine is built,
    rank 0's metrics records of ``iterations`` iterations, {role: dtype} of this rank)."""
    torch.set_num_threads(1)
    kv = {m.num_key_value_heads for m in model_configs(cfg)}
    make_groups(process_cache(TIMEOUT), plan_groups(plan, kv))
    engine = Engine(cfg, plan, process_cache(TIMEOUT), TIMEOUT, lambda _: None)
    built = {n: (sorted(map(str, rm.models)), sorted(map(str, rm.dropped))) for n, rm in engine.roles.items()}
    records = [record_of(it.iteration, it.logs, 0.0) for it in engine.iterate(0, iterations) if it.logs is not None]
    return built, records, {n: rm.dtype for n, rm in engine.roles.items()}


def test_temporary_copies_start_dropped_and_are_built_by_the_first_reallocation():
    """After the build only the homes (and a shadow actor) exist; every other copy is dropped, with
    its groups, until the realloc step before its call builds it from the home. The first iteration
    then equals, bit for bit, the same plan under keep_copies (every copy resident throughout), in
    bf16, where the copies on ranks without the role's home must still reallocate in bf16."""
    cfg = load_config(None, CONFIGS["ppo"] + COMMON + ["sft.warmup=false", "train.dtype=bfloat16"])
    with RankPool(WORLD, timeout=300) as pool:
        lean = pool.run(built_then_run, cfg, plan_of(COPIES), 1)
        kept = pool.run(built_then_run, cfg, plan_of(COPIES, keep=True), 1)
        shadow = pool.run(built_then_run, cfg, plan_of(SHADOW), 0)
    for r in range(WORLD):
        low = r < 2
        assert lean[r][0]["actor"] == ((["dp1tp2pp1@0-1"], ["dp2tp1pp1@0-1"]) if low else ([], [])), r
        assert lean[r][0]["critic"] == (([], ["dp1tp2pp1@0-1"]) if low else (["dp1tp1pp2@2-3"], [])), r
        assert lean[r][0]["ref"] == (([], []) if low else (["dp1tp1pp2@2-3"], [])), r
        assert all(not d for _, d in kept[r][0].values()) and len(kept[r][0]["actor"][0]) == (2 if low else 0)
        assert shadow[r][0]["actor"] == ((["dp1tp2pp1@0-1"], []) if low else (["dp2tp1pp1@2-3"], [])), r
        assert lean[r][2]["critic"] == torch.bfloat16 and lean[r][2]["actor"] == torch.bfloat16, r
    want, got = kept[0][1], lean[0][1]
    assert len(want) == len(got) == 1 and want[0]["reward/mean"] == got[0]["reward/mean"]
    assert deterministic_part(want[0]) == deterministic_part(got[0]), "dropped copies changed the numbers"
