"""SFT, reward-model and DPO training under the multi-rank runtime give the one-process oracle's
numbers (tests/runtime/oracle.py: the calls on plain modules, no runtime).

On 2 gloo ranks, 2 iterations of each algorithm under the colocated plan and one other (SFT:
heuristic, tp=2; RM: a hand-made dp=2 plan with 2 micro-batches, so that pairs are split across
replicas and ZeRO shards the score head's faster learning rate; DPO: interleaved, the reference on
one rank and the actor on the other, so ref_inf's outputs are transferred) agree with
the oracle on every figure of its calls (sft/*, rm/*, dpo/*: loss, accuracy, margin, grad_norm)
to a relative difference of 1e-5 in the first iteration and 1e-4 after it (figures measured on
weights Adam moved: test_plans_equal.py's rule; measured rm/dp2 reward/mean 6.5e-5 at iteration 1),
taken against max(|a|, |b|, 0.1) as in test_plans_equal.py; the same runs in float64 agree to 1e-9
(test_float64_exact.py). The
runtime adds its evaluations (meshrl/algo/evaluate.py: reward/mean of a sampled answer for sft and
dpo, rm/heldout_accuracy), equal under both plans.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meshrl.algo.setup import role_lr
from meshrl.config import load_config
from meshrl.errors import UserError
from meshrl.observe.metrics import deterministic_part
from meshrl.layout.mesh import Layout, Mesh
from meshrl.plan.execution_plan import CallPlan, Cluster, ExecutionPlan
from meshrl.runtime.launch import RankPool
from meshrl.runtime.plans import check_plan, resolve_plan
from meshrl.runtime.run import rank_main
from oracle import one_process_run
from test_plans_equal import STEP_RTOL

WORLD, RTOL, FLOOR = 2, 1e-5, 0.1
COMMON = ["data.batch_size=8", "data.gen_len=6", "train.iterations=2", "sft.steps=5", "sft.batch_size=8",
          "ppo.micro_batches=2"]
# the runtime's evaluations: a sampled answer's reward (sft, dpo), held-out pairs (rm)
EVAL = {"sft": ("reward/mean",), "dpo": ("reward/mean",), "rm": ("rm/heldout_accuracy",)}


def other_plan(cfg) -> ExecutionPlan:
    if cfg.algo == "sft":
        return resolve_plan(cfg, "heuristic", WORLD)[0]
    if cfg.algo == "dpo":
        return resolve_plan(cfg, "interleaved", WORLD)[0]
    plan = ExecutionPlan(Cluster(1, WORLD), {"reward_train": CallPlan(Mesh.range(0, 2), Layout(2, 1, 1), 2)}, "dp2")
    check_plan(cfg, plan)
    return plan


@pytest.fixture(scope="module")
def pool():
    """One set of 2 ranks for the six jobs, run one after another (as in test_plans_equal.py)."""
    with RankPool(WORLD, timeout=300) as p:
        yield p


@pytest.mark.parametrize("algo", ["sft", "rm", "dpo"])
def test_offline_algorithms_give_the_single_process_metrics(algo, pool, tmp_path):
    cfg = load_config(None, [f"algo={algo}"] + COMMON)
    torch.set_num_threads(1)
    want, models = one_process_run(cfg)
    plans = {"colocated": resolve_plan(cfg, "colocated", WORLD)[0], "other": other_plan(cfg)}
    assert plans["other"].calls != plans["colocated"].calls
    evals = []
    for name, plan in plans.items():
        out = str(tmp_path / name) if name == "other" else None  # one exported model per algorithm
        got = pool.run(rank_main, cfg, plan, out, quiet=True)[0]
        assert len(got) == len(want)
        worst, where = 0.0, ""
        for a, b in zip(want, got, strict=True):
            a, b = deterministic_part(a), deterministic_part(b)
            assert set(b) - set(a) == set(EVAL[algo]), f"{name}: keys differ: {set(a) ^ set(b)}"
            evals.append({k: b[k] for k in EVAL[algo]})
            for k in a:
                d = abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k]), FLOOR)
                worst, where = (d, f"{k} at iteration {a['iteration']}") if d > worst else (worst, where)
                bound = RTOL if a["iteration"] == 0 else STEP_RTOL
                assert d <= bound, f"{algo}/{plan.strategy} iteration {a['iteration']}: {k} {a[k]} vs {b[k]}"
        print(f"{algo} {plan.strategy}: worst scaled diff {worst:.1e} ({where})")
    n = len(want)
    for e0, e1 in zip(evals[:n], evals[n:], strict=True):  # the evaluations agree under both plans
        assert all(abs(e0[k] - e1[k]) <= 1e-6 for k in e0), (e0, e1)
    lr, scales = role_lr(cfg, "reward" if algo == "rm" else "actor")
    trained = models["reward" if algo == "rm" else "actor"]
    check_exported(algo, trained, tmp_path / "other", lr * max([s for _, s in scales] + [1.0]),
                   cfg.train.iterations)


def check_exported(algo: str, one: torch.nn.Module, runtime: Path, lr: float, steps: int) -> None:
    """The runtime exports the trained model (reward/ for rm, else actor/) as an HF checkpoint of the
    same kind, with the oracle's weights up to reduction order. Not to 1e-5
    everywhere: Adam's 1/sqrt(v) turns float noise in a near-zero gradient into a step of up to lr,
    so a few elements may differ by up to lr per step (measured: sft 201 of 1.18M elements above 1e-6,
    worst 5.7e-5 at lr 2e-3; rm, whose first gradients are tiny, 3109 of 1.15M, worst 6.6e-5); a
    wrong gather would move most elements."""
    from meshrl.model.checkpoint import load_pretrained

    name = "reward" if algo == "rm" else "actor"
    assert not (runtime / ("actor" if algo == "rm" else "reward")).exists()
    a = one.state_dict()
    b = load_pretrained(runtime / name, value_head=algo == "rm").state_dict()
    assert set(a) == set(b)
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    off = int((diff > 1e-6).sum())
    print(f"{algo}: exported {name} vs the oracle's: {off} of {diff.numel()} elements differ by > 1e-6, "
          f"worst {float(diff.max()):.1e}")
    assert off <= diff.numel() // 100 and float(diff.max()) <= 2 * lr * steps, (off, float(diff.max()))


def test_disaggregated_is_refused_for_offline_algorithms(tmp_path, capsys):
    for algo in ("sft", "rm", "dpo"):
        with pytest.raises(UserError, match="generates nothing"):
            resolve_plan(load_config(None, [f"algo={algo}"]), "disaggregated", WORLD)
    from meshrl.cli import main

    assert main(["train", "algo=dpo", "--nprocs", "2", "--plan", "disaggregated", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "algo=dpo" in err and "generates nothing" in err and "Traceback" not in err


def test_pair_rows_keep_each_pair_in_one_micro_batch():
    from meshrl.algo.batch import Batch
    from meshrl.model.heads import split_micro
    from meshrl.algo.calls_offline import pair_rows

    b = 6
    ids = torch.arange(b)[:, None].repeat(1, 3)
    part = Batch({f"{s}_{k}": ids + (100 if s == "rejected" else 0) for s in ("chosen", "rejected")
                  for k in ("input_ids", "attention_mask", "response_mask")})
    rows, m = pair_rows(part, 4)
    assert m == 3  # the largest divisor of 6 pairs not above 4 micro-batches
    for mb in split_micro(rows, m):
        first = mb["input_ids"][:, 0]
        k = len(first) // 2
        assert torch.equal(first[k:], first[:k] + 100)  # chosen rows, then the same pairs' rejected rows


@pytest.mark.parametrize("algo", ["rm", "dpo"])
def test_pair_calls_are_invariant_to_micro_batches(algo):
    """One process: 1 vs 3 micro-batches of 6 pairs give the same loss and the same plain-SGD update
    (plain SGD: Adam would amplify float noise in near-zero gradients). The dp split is covered by
    the rm dp=2 plan above."""
    import copy

    from meshrl.algo import setup
    from meshrl.algo.common import CallContext
    from meshrl.algo.iteration import dataset, iteration_batch
    from meshrl.model import build_model
    from meshrl.algo.calls import Place
    from meshrl.algo.calls_offline import OFFLINE_CALLS, ref_pair_rows
    from meshrl.algo.handles import LocalHandle

    cfg = load_config(None, [f"algo={algo}", "data.batch_size=6"])
    tok = setup.tokenizer_for(cfg)
    batch, ctx = iteration_batch(dataset(cfg, tok), cfg, 0), CallContext(cfg, 0, tok)
    model = build_model("tiny", seed=7, value_head=algo == "rm")
    if algo == "dpo":
        batch = batch.with_(**ref_pair_rows(LocalHandle(build_model("tiny", seed=8)), batch, ctx, Place()).data)
    train_call = OFFLINE_CALLS[algo]["reward_train" if algo == "rm" else "actor_train"]
    results = []
    for micro in (1, 3):
        m = copy.deepcopy(model)
        st = train_call(LocalHandle(m, torch.optim.SGD(m.parameters(), lr=0.5)), batch, ctx, Place(micro_batches=micro))
        results.append((torch.cat([p.detach().flatten() for p in m.parameters()]), st[f"{algo}/loss"]))
    assert (results[0][0] - torch.cat([p.detach().flatten() for p in model.parameters()])).abs().max() > 1e-5
    assert (results[0][0] - results[1][0]).abs().max() < 1e-6 and abs(results[0][1] - results[1][1]) < 1e-6
