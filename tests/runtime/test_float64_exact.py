"""``train.dtype=float64``: the whole pipeline (generation, training, optimizer, communication) in
float64, so that every plan and every world size give the one-process figures to 1e-9 relative.

In float32 the plans agree only to 1e-5 .. 1e-3 (test_plans_equal.py): summation-order noise of
~1e-7 in near-zero gradient elements becomes whole Adam steps. In float64 the same noise is ~1e-16
and stays far below 1e-9 over the iterations run here, so an equality check can be tight: a plan
that splits a batch wrongly, drops a token or adds a step moves figures by 1e-3 or more.
Sampling stays batch-invariant (the same tokens under every plan), so the figures compared are
those of the same sequences."""

from __future__ import annotations

import json

import pytest
import torch

from meshrl.config import load_config
from meshrl.runtime.launch import RankPool
from meshrl.runtime.run import rank_main
from oracle import one_process_metrics
from runtime_util import random_plan
from test_plans_equal import COMMON, CONFIGS, FLOOR, comparable, plans_for

EXACT = 1e-9
PLANS = ("colocated", "disaggregated", "random1")  # random1 uses tp > 1 and pp > 1 (plans_for)


def config(algo: str, extra: tuple[str, ...] = ()):
    return load_config(None, CONFIGS[algo] + COMMON + ["train.dtype=float64", *extra])


def worst_diff(want: list[dict], got: list[dict]) -> tuple[float, str]:
    """The largest |a - b| / max(|a|, |b|, FLOOR) over every deterministic figure but the plan's own
    (weight_sync/), and where; the engine-vs-trainer mismatch of each record must be below 1e-9."""
    assert [r["iteration"] for r in want] == [r["iteration"] for r in got]
    worst, where = 0.0, ""
    for a, b in zip(want, got, strict=True):
        a, b = comparable(a, EXACT), comparable(b, EXACT)  # the engine's mismatch: test_plans_equal.comparable
        assert sorted(a) == sorted(b), f"keys differ: {sorted(set(a) ^ set(b))}"
        for k in a:
            d = abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k]), FLOOR)
            if d > worst:
                worst, where = d, f"iteration {a['iteration']} {k}: {a[k]!r} vs {b[k]!r}"
    return worst, where


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, timeout=300, env={"OMP_NUM_THREADS": "1"}) as p:
        yield p


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_plan_gives_the_one_process_figures_to_1e9(algo, pool):
    cfg = config(algo)
    torch.set_num_threads(1)
    want = one_process_metrics(cfg)
    assert want[0]["reward/std"] > 0  # advantages carry signal
    plans = plans_for(cfg)
    for name in PLANS:
        got = pool.run(rank_main, cfg, plans[name], None, quiet=True)[0]
        worst, where = worst_diff(want, got)
        print(f"{algo}/{name}: worst scaled difference {worst:.1e} ({where})")
        assert worst <= EXACT, f"{algo}/{name}: {where} (scaled difference {worst:.1e})"


def test_a_resharded_resume_continues_as_the_one_process_run_to_1e9(tmp_path):
    """2 iterations on 4 ranks (heuristic), then --resume on 2 ranks colocated to 4 iterations, and
    the same 4 iterations in one process (the one path): every figure of every iteration to 1e-9."""
    from meshrl.cli import main
    from meshrl.observe.metrics import read_metrics

    items = [*CONFIGS["ppo"], *COMMON, "train.dtype=float64", "train.threads=1", "--no-progress"]
    a, one = tmp_path / "a", tmp_path / "one"
    assert main(["train", *items, "train.iterations=2", "--nprocs", "4", "--plan", "heuristic", "--out", str(a)]) == 0
    assert main(["train", *items, "train.iterations=4", "--nprocs", "2", "--plan", "colocated", "--out", str(a),
                 "--resume"]) == 0
    assert main(["train", *items, "train.iterations=4", "--out", str(one)]) == 0
    worst, where = worst_diff(read_metrics(one / "metrics.jsonl"), read_metrics(a / "metrics.jsonl"))
    print(f"resharded resume vs one process: worst scaled difference {worst:.1e} ({where})")
    assert worst <= EXACT, where


def test_two_steps_off_policy_gives_the_same_figures_under_every_plan(pool):
    """train.off_policy=2: generation runs two iterations ahead, from weights two updates old (the
    config's schedule, not the timing's), so the colocated, disaggregated and a random plan agree to
    1e-9; the staleness is logged, and the run differs from one step off-policy."""
    cfg = config("ppo", ("train.off_policy=2", "train.stream_steps=0", "train.iterations=4"))
    torch.set_num_threads(1)
    plans = plans_for(cfg)
    want = pool.run(rank_main, cfg, plans["colocated"], None, quiet=True)[0]
    assert [r["rollout/staleness_max"] for r in want] == [0.0, 1.0, 2.0, 2.0]
    one = pool.run(rank_main, config("ppo", ("train.off_policy=1", "train.iterations=4")), plans["colocated"], None,
                   quiet=True)[0]
    assert [r["reward/mean"] for r in one[2:]] != [r["reward/mean"] for r in want[2:]]
    for name in ("disaggregated", "random1"):
        got = pool.run(rank_main, cfg, plans[name], None, quiet=True)[0]
        worst, where = worst_diff(want, got)
        print(f"off_policy=2 {name} vs colocated: worst scaled difference {worst:.1e} ({where})")
        assert worst <= EXACT, where


def gen_sharded(cfg):
    """A random plan whose generation runs under tp 2 x pp 2 with 2 micro-batches: the rows in flight
    are kept on the four ranks of the replica, and resharded from them on resume."""
    plan = random_plan(cfg, 35)
    cp = plan.calls["actor_gen"]
    assert (cp.layout.tp, cp.layout.pp, cp.micro_batches) == (2, 2, 2)
    return plan


def test_a_streamed_run_killed_after_a_checkpoint_resumes_resharded_as_uninterrupted(tmp_path, monkeypatch):
    """train.off_policy=2, train.stream_steps=2: 4 iterations on 4 ranks under ``gen_sharded``,
    rank 0 killed as it starts training iteration 2 (the checkpoint of iteration 1 holds
    batch 2 finished and batch 3 half-generated), --resume on 2 ranks colocated; every figure of the
    4 iterations equals the uninterrupted run's (same first plan) to 1e-9."""
    from meshrl.cli import main
    from meshrl.observe.metrics import read_metrics

    items = [*CONFIGS["ppo"], *COMMON, "train.dtype=float64", "train.threads=1", "--no-progress",
             "train.off_policy=2", "train.stream_steps=2", "train.iterations=4", "train.save_every=1"]
    plan = tmp_path / "gen-sharded.json"
    plan.write_text(gen_sharded(config("ppo", ("train.off_policy=2", "train.stream_steps=2"))).to_json())
    a, whole = tmp_path / "a", tmp_path / "whole"
    monkeypatch.setenv("MESHRL_FAULT", "0:actor_train@2")
    assert main(["train", *items, "--nprocs", "4", "--plan", str(plan), "--out", str(a)]) != 0
    monkeypatch.delenv("MESHRL_FAULT")
    assert [p.name for p in a.glob("ckpt-*")] == ["ckpt-000001"]
    assert json.loads((a / "ckpt-000001" / "meta.json").read_text())["ahead"] == [2, 3]
    assert main(["train", *items, "--nprocs", "2", "--plan", "colocated", "--out", str(a), "--resume"]) == 0
    assert main(["train", *items, "--nprocs", "4", "--plan", str(plan), "--out", str(whole)]) == 0
    got, want = read_metrics(a / "metrics.jsonl"), read_metrics(whole / "metrics.jsonl")
    assert want[3]["rollout/interrupted"] > 0
    worst, where = worst_diff(want, got)
    print(f"streamed resharded resume vs uninterrupted: worst scaled difference {worst:.1e} ({where})")
    assert worst <= EXACT, where


def test_streamed_partial_rollouts_give_the_same_figures_under_every_plan(pool):
    """train.off_policy=2 with train.stream_steps=2 (gen_len 6): each batch is admitted two versions
    before it trains, its first 2 tokens sampled there and the rest after the next update (its
    sequences in flight continue under the new weights). The weight updates land at fixed decode
    steps, so four plans (generation under dp 4, dp 2, tp 4, tp 2 x pp 2) agree to 1e-9; sequences were interrupted
    and the staleness is per token. With stream_steps >= gen_len nothing is in flight across an
    update: exactly the whole-batch off_policy=2 run."""
    torch.set_num_threads(1)
    cfg = config("ppo", ("train.off_policy=2", "train.stream_steps=2", "train.iterations=4"))
    plans = plans_for(cfg)
    want = pool.run(rank_main, cfg, plans["colocated"], None, quiet=True)[0]
    assert [r["rollout/staleness_max"] for r in want] == [0.0, 1.0, 2.0, 2.0]
    assert all(r["rollout/interrupted"] > 0 for r in want[2:]) and want[0]["rollout/interrupted"] == 0.0
    assert all(1.0 < r["rollout/staleness_mean"] < 2.0 for r in want[2:])
    whole_cfg = config("ppo", ("train.off_policy=2", "train.stream_steps=0", "train.iterations=4"))
    whole = pool.run(rank_main, whole_cfg, plans["colocated"],
                     None, quiet=True)[0]
    assert [r["reward/mean"] for r in whole[2:]] != [r["reward/mean"] for r in want[2:]]
    same = pool.run(rank_main, config("ppo", ("train.off_policy=2", "train.stream_steps=6", "train.iterations=4")),
                    plans["colocated"], None, quiet=True)[0]
    assert worst_diff(whole, same)[0] == 0.0
    plans["gen-sharded"] = gen_sharded(cfg)
    for name in ("disaggregated", "heuristic", "gen-sharded"):
        got = pool.run(rank_main, cfg, plans[name], None, quiet=True)[0]
        worst, where = worst_diff(want, got)
        print(f"off_policy=2 stream_steps=2 {name} vs colocated: worst scaled difference {worst:.1e} ({where})")
        assert worst <= EXACT, where


@pytest.mark.parametrize("algo", ["grpo", "remax"])
def test_streamed_groups_and_the_greedy_baseline_agree_under_two_plans(algo, pool):
    """Streaming with k = 3, S = 2 for GRPO (groups of 2 samples; sequences span up to three
    versions; decoupled PPO, whose truncated weight pi_prox / pi_behav takes each token's own
    version) and ReMax (its greedy baseline streamed too): heuristic and disaggregated agree with
    colocated to 1e-9, and some sequences were interrupted before their bound."""
    torch.set_num_threads(1)
    base = CONFIGS["grpo"] + ["ppo.decoupled=true"] if algo == "grpo" else ["algo=remax", "data.batch_size=8"]
    cfg = load_config(None, base + COMMON + ["train.dtype=float64", "train.off_policy=3", "train.stream_steps=2",
                                             "train.iterations=4"])
    plans = plans_for(cfg)
    want = pool.run(rank_main, cfg, plans["colocated"], None, quiet=True)[0]
    assert want[3]["rollout/staleness_max"] == 3.0
    assert want[3]["rollout/interrupted"] > want[3]["rollout/at_bound"]  # interrupted, then ended before the bound
    if algo == "grpo":
        assert abs(want[3]["rollout/is_weight_mean"] - 1.0) > 1e-3  # stale tokens: weights away from 1
    for name in ("disaggregated", "heuristic"):
        got = pool.run(rank_main, cfg, plans[name], None, quiet=True)[0]
        worst, where = worst_diff(want, got)
        print(f"{algo} off_policy=3 stream_steps=2 {name} vs colocated: worst scaled difference {worst:.1e} ({where})")
        assert worst <= EXACT, where


@pytest.mark.parametrize("algo", ["sft", "rm", "dpo"])
def test_offline_algorithms_give_the_one_process_figures_to_1e9(algo):
    """SFT, reward-model and DPO training on 2 ranks under test_offline_plans.py's other plan (tp=2;
    dp=2 with 2 micro-batches; the reference on its own rank) against the one-process oracle."""
    from test_offline_plans import COMMON as OFFLINE, EVAL, other_plan
    from oracle import one_process_run

    cfg = load_config(None, [f"algo={algo}", *OFFLINE, "train.dtype=float64"])
    torch.set_num_threads(1)
    want = one_process_run(cfg)[0]
    with RankPool(2, timeout=300, env={"OMP_NUM_THREADS": "1"}) as pool2:
        got = pool2.run(rank_main, cfg, other_plan(cfg), None, quiet=True)[0]
    got = [{k: v for k, v in r.items() if k not in EVAL[algo]} for r in got]  # the runtime's evaluations
    worst, where = worst_diff(want, got)
    print(f"{algo}: worst scaled difference {worst:.1e} ({where})")
    assert worst <= EXACT, where
