"""The tests' one-process oracle for the runtime: the algorithm's calls (meshrl/algo/calls.py) in
graph order on plain modules (LocalHandle: a CausalLM / ValueModel with torch's own AdamW), with no
process group, no ParallelModel, no ZeRO, no reallocation and no transfer, starting from the
runtime's own SFT warm-up (``warmed_actor``, which is plan-independent and checked on its own). A
plan's metrics must equal these up to reduction order. Not a trainer: it writes nothing and reports only the calls'
statistics and the rollout metrics."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from meshrl.algo import setup
from meshrl.algo.calls import Place, row_wise
from meshrl.algo.dispatch import implementation
from meshrl.algo.common import CallContext
from meshrl.algo.evaluate import eval_due, evaluate_local
from meshrl.algo.graph import graph_of
from meshrl.algo.handles import LocalHandle
from meshrl.algo.iteration import RL_ALGOS, dataset, iteration_batch, rollout_metrics
from meshrl.algo.registry import tensor_keys
from meshrl.model.checkpoint import load_pretrained
from meshrl.runtime.launch import RankPool
from meshrl.algo.batch import Batch
from meshrl.algo.calls_offline import sft_train
from meshrl.algo.common import make_optimizer
from meshrl.algo.iteration import choose_rows


def one_process_metrics(cfg) -> list[dict]:
    """One record per iteration: rollout metrics (RL), every call's statistics, and the eval.path
    evaluation (meshrl/algo/evaluate.py) when due."""
    return one_process_run(cfg)[0]


def one_process_run(cfg) -> tuple[list[dict], dict[str, torch.nn.Module]]:
    """(the records of ``one_process_metrics``, the trained role -> its module at the end)."""
    torch.manual_seed(cfg.train.seed)
    tok = setup.tokenizer_for(cfg)
    actor = warmed_actor(cfg) if setup.warms_up(cfg) else setup.load_policy(cfg, cfg.train.seed)
    roles = setup.build_roles(cfg, actor)
    if cfg.train.dtype == "float64":  # the whole pipeline in float64, as the runtime runs it
        for r in roles.values():
            if r.model is not None:
                r.model.double()  # in place: the optimizers keep their parameters
    handles = {n: LocalHandle(r.model, r.optim, cfg.optim.grad_clip) if r.model is not None else None
               for n, r in roles.items()}
    graph = graph_of(cfg)
    data = dataset(cfg, tok)
    records = []
    for it in range(cfg.train.iterations):
        evaluated = evaluate_local(handles["actor"], cfg, tok, it) if eval_due(cfg, it) else {}  # before the update
        ctx, batch, stats = CallContext(cfg, it, tok), iteration_batch(data, cfg, it), {}
        for call in graph.calls:
            res = implementation(call, cfg.algo)(handles[call.role], batch.only(tensor_keys(call.inputs)), ctx,
                                                 Place(micro_batches=cfg.ppo.micro_batches))
            if row_wise(call):
                batch = batch.with_(**res.data)
            else:
                stats.update(res)
        rollout = rollout_metrics(batch, cfg) if cfg.algo in RL_ALGOS else {}
        records.append({"iteration": it, **rollout, **stats, **evaluated})
    return records, {n: r.model for n, r in roles.items() if r.model is not None}



def warmup_local(actor: torch.nn.Module, cfg, tok) -> None:
    """The SFT warm-up (meshrl/runtime/warmup.py) on the whole actor in this process, with torch's
    AdamW: the same rows per step, loss and settings, none of the runtime's machinery."""
    data = setup.encode_sft_batch(cfg, tok, setup.sft_records(cfg, warmup=True))
    h = LocalHandle(actor, make_optimizer(actor, cfg.sft.lr, cfg.optim.weight_decay), cfg.optim.grad_clip)
    for step in range(cfg.sft.steps):
        rows = choose_rows(len(data), cfg.sft.batch_size, cfg.train.seed, "warmup", step)
        sft_train(h, Batch(data.select(rows).data), CallContext(cfg, step, tok, algo="sft"),
                  Place(micro_batches=cfg.ppo.micro_batches))


def _warm(cfg, path: str) -> None:
    from meshrl.parallel.groups import GroupCache
    from meshrl.runtime.warmup import warmup_sharded

    warmup_sharded(cfg, setup.tokenizer_for(cfg), GroupCache(), Path(path), lambda _: None, 300.0)


def warmed_actor(cfg) -> torch.nn.Module:
    """The runtime's SFT warm-up (meshrl/runtime/warmup.py) run on one local rank, loaded whole.
    Every plan of a run starts RL from exactly these weights: the warm-up's placement depends on the
    world size only, and its pipeline stages compute what one stage does (pp4 and pp1 measured bit-
    equal). The oracle checks the RL that follows from the same start; the warm-up itself is checked
    against ``warmup_local`` (tests/runtime/test_no_whole_model.py): the two differ by rounding, which
    30 AdamW steps carry to ~1e-5 in the weights and 3 PPO iterations to ~6e-4 in a gradient norm,
    beyond what plan invariance tolerates."""
    with tempfile.TemporaryDirectory(prefix="oracle-warmup-") as d, RankPool(1, timeout=300) as pool:
        pool.run(_warm, cfg, d)
        return load_pretrained(d, dtype=torch.float64 if cfg.train.dtype == "float64" else torch.float32)
