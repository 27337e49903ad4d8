"""The tests' one-process oracle for the runtime: the algorithm's calls (meshrl/algo/calls.py) in
graph order on plain modules (LocalHandle: a CausalLM / ValueModel with torch's own AdamW), with no
process group, no ParallelModel, no ZeRO, no reallocation and no transfer. A plan's metrics must
equal these up to reduction order. Not a trainer: it writes nothing and reports only the calls'
statistics and the rollout metrics."""

from __future__ import annotations

import torch

from meshrl.algo import setup
from meshrl.algo.calls import Place, implementation, row_wise
from meshrl.algo.common import CallContext
from meshrl.algo.evaluate import eval_due, evaluate_local
from meshrl.algo.graph import graph_for
from meshrl.algo.handles import LocalHandle
from meshrl.algo.iteration import RL_ALGOS, dataset, iteration_batch, rollout_metrics
from meshrl.algo.registry import tensor_keys
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
    actor = setup.load_policy(cfg, cfg.train.seed)
    if setup.warms_up(cfg):
        warmup_local(actor, cfg, tok)
    roles = setup.build_roles(cfg, actor)
    handles = {n: LocalHandle(r.model, r.optim, cfg.optim.grad_clip) if r.model is not None else None
               for n, r in roles.items()}
    graph = graph_for(cfg.algo, cfg.data.samples_per_prompt)
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
