"""The demo's quick SFT warm-up, sharded: before RL (and DPO and the reward model) starts from a
random preset, a few steps of supervised fine-tuning on noisy demonstrations (or the user's
``sft.path``), run by the ranks themselves, so that no rank ever holds the whole model.

Where it runs: a pipeline over the world's first K ranks, K = min(world size, layers), dp = tp = 1
(``warmup_placement``). Every rank holds only its stage's layers, and the placement depends on the
world size alone, not on the plan, so every plan of a run starts RL from bit-identical weights (a
plan-dependent placement would make the warm-up differ by reduction order between plans).
It trains in ``train.dtype`` with ZeRO-1 AdamW (bf16 weights and fp32 master weights in bf16), at
``sft.lr``, through the same ``ParallelModel.forward_backward`` / ``optimizer_step`` and
``algo.calls_offline.sft_train`` as ``algo=sft``.

The result is written as a Hugging Face checkpoint, stage by stage by the ranks holding it
(runtime/export.py), to ``OUT/sft-warmup`` (a temporary directory when the run has no ``--out``),
and every role's loader then reads only its own slices from there (parallel/load.py), whatever
its layout: the ref and the critic's backbone start from the same weights as the actor.
"""

from __future__ import annotations

import datetime
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from ..algo import setup
from ..algo.batch import Batch
from ..algo.calls import Place
from ..algo.calls_offline import sft_train
from ..algo.common import CallContext
from ..algo.iteration import choose_rows
from ..config import Config
from ..layout.mesh import Placement
from ..parallel import comm
from ..parallel.data import AdamWConfig
from ..parallel.groups import GroupCache
from ..parallel.model import ParallelModel
from ..parallel.precision import torch_dtype
from .export import export_sharded
from .roles import actor_start

DIR_NAME = "sft-warmup"  # under OUT: the warmed-up actor, a Hugging Face checkpoint


def warmup_placement(layers: int, world: int) -> Placement:
    """dp1 tp1 ppK on ranks 0..K-1, K = min(world, layers): depends on the world size only."""
    k = min(world, layers)
    return Placement.parse(f"dp1tp1pp{k}@0-{k - 1}" if k > 1 else "dp1tp1pp1@0")


def warmup_dir(out: str | Path | None) -> tuple[Path, bool]:
    """(where the warm-up is written, whether it is temporary): ``OUT/sft-warmup``, else a fresh
    temporary directory made by rank 0 and announced to all (local ranks share the file system)."""
    if out is not None:
        return Path(out) / DIR_NAME, False
    path = tempfile.mkdtemp(prefix="meshrl-warmup-") if dist.get_rank() == 0 else None
    return Path(comm.broadcast_object(path, 0, comm.control(None))), True


def warmup_sharded(cfg: Config, tok, cache: GroupCache, path: Path, log: Callable[[str], None],
                   timeout_s: float) -> Path:
    """cfg.sft.steps SFT steps of cfg.sft.batch_size demonstrations on the actor (the preset's
    seeded init, or the user's checkpoint given sft.path), on every rank of the world (collective),
    written to ``path``; -> ``path`` once every stage is there."""
    mcfg, start = actor_start(cfg, torch_dtype(cfg.train.dtype))
    placement = warmup_placement(mcfg.num_hidden_layers, dist.get_world_size())
    optim = AdamWConfig(lr=cfg.sft.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.optim.weight_decay,
                        max_grad_norm=cfg.optim.grad_clip)
    pm = ParallelModel.create(mcfg, placement, cache, start, optim=optim,
                              timeout_s=timeout_s,
                              activation_checkpointing=cfg.train.activation_checkpointing)
    losses: list[float] | None = None
    if pm is not None:
        data = setup.encode_sft_batch(cfg, tok, setup.sft_records(cfg, warmup=True))
        last = pm.stage.last
        place = Place(0, 1, cfg.ppo.micro_batches, holds_output=last)
        losses = []
        for step in range(cfg.sft.steps):
            rows = choose_rows(len(data), cfg.sft.batch_size, cfg.train.seed, "warmup", step)
            st = sft_train(pm, Batch(data.select(rows).data), CallContext(cfg, step, tok, algo="sft"), place)
            if last:
                losses.append(st["sft/loss"])
        export_sharded(pm, path, tok, timeout_s)
        del pm
    got: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    comm.gather_object(losses or None, got, 0, comm.control(None))  # also: every stage's file is written
    if got is not None:
        curve = next(x for x in reversed(got) if x)  # the last stage's
        what = f"demonstrations from {cfg.sft.path}" if cfg.sft.path else "noisy demonstrations"
        log(f"SFT warm-up: {cfg.sft.steps} steps of {cfg.sft.batch_size} {what} on ranks {placement.mesh} "
            f"({placement.layout}), loss {curve[0]:.3f} -> {curve[-1]:.3f}")
    comm.barrier(comm.control(None), datetime.timedelta(seconds=timeout_s))
    return path


def remove_temporary(path: Path, timeout_s: float) -> None:
    """Rank 0 removes a temporary warm-up directory once every rank has loaded its shards."""
    comm.barrier(comm.control(None), datetime.timedelta(seconds=timeout_s))
    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)

