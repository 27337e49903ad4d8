"""The single-process trainer: build the roles, then walk the algorithm's call graph once per
iteration, passing one Batch from call to call. It reads top to bottom as the story of a run:

    warm-up SFT (demo only) -> for each iteration: choose data -> run every call in graph order
    -> metrics (JSONL, TensorBoard, one console line) -> save the trained model

Every call is the runtime's own code (meshrl/algo/calls.py, calls_offline.py) run on a
one-process handle (LocalHandle), so this trainer and every multi-rank plan share one
implementation. Each call gets only its role and the batch keys it declared, and must return
exactly the keys it declared (checked here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import Config
from ..observe.metrics import MetricsWriter, no_signal_note, summary_line
from .calls import Place, generate_rows, implementation, row_wise, score_rows
from .calls_offline import sft_train
from .handles import LocalHandle
from . import setup
from .batch import Batch
from .common import CallContext, Role, key_seed, keyed_generator, make_optimizer
from .evaluate import eval_due, evaluate_local
from .filtering import prompts_per_iteration
from .graph import Graph, graph_for
from .kl import kl_estimate
from .registry import side, tensor_keys
from .user_rewards import part_names

RL_ALGOS = ("ppo", "grpo", "remax", "rloo")
CONSOLE_KEYS = {
    "rl": ("reward/mean", "kl/k1", "actor/pg_loss", "critic/vf_loss", "response/length"),
    "sft": ("sft/loss", "reward/mean"), "dpo": ("dpo/loss", "dpo/accuracy", "reward/mean"),
    "rm": ("rm/loss", "rm/accuracy", "rm/heldout_accuracy"),
}


def console_keys(algo: str) -> tuple[str, ...]:
    """The figures of a run's one console line per iteration."""
    return CONSOLE_KEYS["rl" if algo in RL_ALGOS else algo]


@dataclass
class RunResult:
    metrics: list[dict] = field(default_factory=list)
    warmup: list[dict] = field(default_factory=list)
    model_dir: Path | None = None


def handles_for(roles: dict[str, Role], cfg: Config) -> dict[str, LocalHandle | None]:
    """Each role's one-process handle (None for a rule reward)."""
    return {name: LocalHandle(r.model, r.optim, cfg.optim.grad_clip) if r.model is not None else None
            for name, r in roles.items()}


def local_place(cfg: Config) -> Place:
    """A one-process call's place: the whole batch, ppo.micro_batches micro-batches per step."""
    return Place(micro_batches=cfg.ppo.micro_batches)


def run_graph(graph: Graph, handles: dict[str, LocalHandle | None], batch: Batch, ctx: CallContext
              ) -> tuple[Batch, dict[str, float]]:
    """Run every call in order; returns the batch with all outputs, and stats incl. time/call/*."""
    stats: dict[str, float] = {}
    for call in graph.calls:
        fn = implementation(call, ctx.algo)
        t0 = time.perf_counter()
        res = fn(handles[call.role], batch.only(tensor_keys(call.inputs)), ctx, local_place(ctx.cfg))
        out, st = (res, {}) if row_wise(call) else (Batch(), res)
        stats[f"time/call/{call.name}"] = time.perf_counter() - t0
        want = sorted(tensor_keys(call.outputs))
        if sorted(out.keys()) != want:
            raise RuntimeError(f"call {call.name} wrote {sorted(out.keys())}, but its contract says {want}")
        batch = batch.with_(**out.data)
        stats.update(st)
    return batch, stats


def choose_rows(n_data: int, n: int, *key: object) -> torch.Tensor:
    """``n`` dataset rows for one iteration, keyed by (seed, iteration): without repeats if possible."""
    g = keyed_generator(*key)
    return torch.randperm(n_data, generator=g)[:n] if n <= n_data else torch.randint(n_data, (n,), generator=g)


def rollout_batch(prompts: Batch, cfg: Config, iteration: int) -> Batch:
    """The iteration's prompts, each repeated samples_per_prompt times (prompt-major), with the
    sampling seed of every (prompt, sample): same tokens whatever the split or batch order."""
    b, n, seed = prompts_per_iteration(cfg), cfg.data.samples_per_prompt, cfg.train.seed
    rows = choose_rows(len(prompts), b, seed, "prompts", iteration).repeat_interleave(n)
    sample = torch.arange(n).repeat(b)
    seeds = torch.tensor([key_seed(seed, iteration, int(p), int(s)) for p, s in zip(rows, sample, strict=True)])
    return Batch(prompts.select(rows).data).with_(sample_seed=seeds)


def rollout_metrics(batch: Batch, cfg: Config | None = None) -> dict[str, float]:
    """Figures of the iteration's generated batch (all of it, also under data.filter_groups): reward
    mean/std, each reward source as reward/NAME (reward.fn, overlong), response length, KL."""
    mask = batch["response_mask"].float()
    out = {"reward/mean": float(batch["scores"].mean()), "reward/std": float(batch["scores"].std()),
           "response/length": float(mask.sum(-1).mean()), "response/length_max": float(mask.sum(-1).max())}
    if cfg is not None and "score_parts" in batch:
        for name, col in zip(part_names(cfg), batch["score_parts"].float().unbind(1), strict=True):
            out[f"reward/{name}"] = float(col.mean())
    if "logp_ref" in batch:
        out["kl/k1"] = float((kl_estimate(batch["logp_old"], batch["logp_ref"], "k1") * mask).sum(-1).mean())
        out["kl/k3"] = float((kl_estimate(batch["logp_old"], batch["logp_ref"], "k3") * mask).sum(-1).mean())
    if "scores_greedy" in batch:
        out["reward/greedy_mean"] = float(batch["scores_greedy"].mean())
    return out


def eval_policy(actor: LocalHandle, prompts: Batch, cfg: Config, tok, iteration: int) -> dict[str, float]:
    """Rule reward of one sample per prompt for batch_size prompts (SFT and DPO runs report it)."""
    ctx = CallContext(cfg, iteration, tok, algo="ppo")
    b = rollout_batch(prompts, cfg, iteration)
    seqs = generate_rows(actor, b, ctx, local_place(cfg))
    return {"reward/mean": float(score_rows(None, seqs.with_(answer_ids=b["answer_ids"], row_id=b["row_id"]), ctx,
                                            local_place(cfg))
                                 ["scores"].mean())}


def warmup_sft(actor: torch.nn.Module, cfg: Config, tok, log: Callable[[str], None], progress: bool) -> list[dict]:
    """The demo's quick SFT on noisy demonstrations, before RL starts from a random preset."""
    from tqdm import tqdm

    data = setup.encode_sft_batch(cfg, tok, setup.sft_records(cfg, warmup=True))
    h = LocalHandle(actor, make_optimizer(actor, cfg.sft.lr, cfg.optim.weight_decay), cfg.optim.grad_clip)
    records = []
    bar = tqdm(range(cfg.sft.steps), desc="SFT warm-up", disable=not progress, leave=False)
    for step in bar:
        rows = choose_rows(len(data), cfg.sft.batch_size, cfg.train.seed, "warmup", step)
        st = sft_train(h, Batch(data.select(rows).data), CallContext(cfg, step, tok, algo="sft"), local_place(cfg))
        records.append({"step": step, **st})
        bar.set_postfix(loss=f"{st['sft/loss']:.3f}")
    what = f"demonstrations from {cfg.sft.path}" if cfg.sft.path else "noisy demonstrations"
    log(f"SFT warm-up: {cfg.sft.steps} steps of {cfg.sft.batch_size} {what}, "
        f"loss {records[0]['sft/loss']:.3f} -> {records[-1]['sft/loss']:.3f}")
    return records


def offline_batch(data: Batch, cfg: Config, iteration: int) -> Batch:
    rows = choose_rows(len(data), cfg.data.batch_size, cfg.train.seed, "batch", iteration)
    return Batch(data.select(rows).data)


def dataset(cfg: Config, tok) -> Batch:
    """What the iterations draw from: the prompts (RL), SFT sequences (sft) or preference pairs
    (rm, dpo). The multi-rank engine reads it as this trainer does."""
    if cfg.algo == "sft":
        return setup.encode_sft_batch(cfg, tok, setup.sft_records(cfg))
    if cfg.algo in ("rm", "dpo"):
        return setup.encode_pair_batch(cfg, tok, setup.pair_records(cfg))
    return setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg))


def iteration_batch(data: Batch, cfg: Config, iteration: int) -> Batch:
    """The batch iteration ``iteration`` starts from, keyed by (seed, iteration) only."""
    return rollout_batch(data, cfg, iteration) if cfg.algo in RL_ALGOS else offline_batch(data, cfg, iteration)


def chosen_scores(rm: LocalHandle, pairs: Batch, ctx: CallContext) -> torch.Tensor:
    """The reward model's score of the chosen side of each pair [B]."""
    return score_rows(rm, side(pairs, "chosen_"), ctx, Place())["scores"]


def rm_accuracy(rm: LocalHandle, pairs: Batch, ctx: CallContext) -> float:
    """Fraction of pairs where the reward model scores the chosen side above the rejected one."""
    rejected = score_rows(rm, side(pairs, "rejected_"), ctx, Place())["scores"]
    return float((chosen_scores(rm, pairs, ctx) > rejected).float().mean())


def train(cfg: Config, out: str | Path | None, log: Callable[[str], None] = print, progress: bool = True,
          tensorboard: bool = True) -> RunResult:
    """Run ``cfg.algo`` for ``cfg.train.iterations`` iterations; write metrics and the model to ``out``."""
    from tqdm import tqdm

    torch.manual_seed(cfg.train.seed)
    algo, result = cfg.algo, RunResult()
    tok = setup.tokenizer_for(cfg)
    actor = setup.load_policy(cfg, cfg.train.seed)
    # The demo's quick SFT precedes RL, DPO, and the reward model (initialised from the SFT model,
    # as in InstructGPT).
    if setup.warms_up(cfg):
        result.warmup = warmup_sft(actor, cfg, tok, log, progress)
    roles = setup.build_roles(cfg, actor)
    handles = handles_for(roles, cfg)
    graph = graph_for(algo, cfg.data.samples_per_prompt)
    log(f"{algo}: calls {' -> '.join(graph.names)}")
    # the demo's prompts, for the sft/dpo demo's own evaluation only (never with a user's data)
    prompts = setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg)) if cfg.data.path is None else None
    data, heldout = dataset(cfg, tok), None
    if algo in ("rm", "dpo") and cfg.data.path is None:  # the demo's held-out pairs; a user's JSONL has none
        heldout = setup.encode_pair_batch(cfg, tok, setup.pair_records(cfg, heldout=True))
    writer = MetricsWriter(out, tensorboard) if out is not None else None
    keys = console_keys(algo)
    bar = tqdm(range(cfg.train.iterations), desc=algo, disable=not progress)
    noted = False  # the no-signal note is given once
    for it in bar:
        t0 = time.perf_counter()
        evaluated = evaluate_local(handles["actor"], cfg, tok, it) if eval_due(cfg, it) and "actor" in handles else {}
        ctx = CallContext(cfg, it, tok)
        batch = iteration_batch(data, cfg, it)
        batch, stats = run_graph(graph, handles, batch, ctx)
        record = {"iteration": it, **(rollout_metrics(batch, cfg) if algo in RL_ALGOS else {}), **stats, **evaluated}
        if algo in ("sft", "dpo") and cfg.data.path is None:
            record.update(eval_policy(handles["actor"], prompts, cfg, tok, it))
        if algo == "rm" and heldout is not None and (it % 10 == 0 or it == cfg.train.iterations - 1):
            record["rm/heldout_accuracy"] = rm_accuracy(handles["reward"], heldout, ctx)
        record["time/iteration"] = time.perf_counter() - t0
        record["perf/tokens_per_s"] = float(batch.tokens().sum()) / record["time/iteration"]
        result.metrics.append(record)
        if writer is not None:
            writer.write(record)
        bar.write(summary_line(record, keys)) if progress else log(summary_line(record, keys))
        note = no_signal_note(record) if not noted else None
        if note:
            noted = True
            bar.write(note) if progress else log(note)
        if "reward/mean" in record:
            bar.set_postfix(reward=f"{record['reward/mean']:.3f}")
    if writer is not None:
        writer.close()
    if out is not None:
        result.model_dir = save_trained(roles, algo, tok, Path(out))
    return result


def save_trained(roles: dict[str, Role], algo: str, tok, out: Path) -> Path:
    """The trained model as an HF checkpoint: out/reward for algo=rm, else out/actor."""
    name = "reward" if algo == "rm" else "actor"
    path = out / name
    roles[name].model.save_pretrained(str(path))
    if hasattr(tok, "save_pretrained"):
        tok.save_pretrained(str(path))
    return path
