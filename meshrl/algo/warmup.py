"""The demo's quick SFT warm-up: before RL (and DPO and the reward model) starts from a random
preset, a few steps of supervised fine-tuning on noisy demonstrations, run once on one process
(the runtime's rank 0 does it and broadcasts the weights, so every plan starts from the same ones).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import Config
from . import setup
from .batch import Batch
from .calls import Place
from .calls_offline import sft_train
from .common import CallContext, make_optimizer
from .handles import LocalHandle
from .iteration import choose_rows


def warmup_sft(actor: torch.nn.Module, cfg: Config, tok, log: Callable[[str], None], progress: bool) -> list[dict]:
    """cfg.sft.steps steps of cfg.sft.batch_size demonstrations on ``actor`` (in place); -> per-step stats."""
    from tqdm import tqdm

    data = setup.encode_sft_batch(cfg, tok, setup.sft_records(cfg, warmup=True))
    h = LocalHandle(actor, make_optimizer(actor, cfg.sft.lr, cfg.optim.weight_decay), cfg.optim.grad_clip)
    records = []
    bar = tqdm(range(cfg.sft.steps), desc="SFT warm-up", disable=not progress, leave=False)
    for step in bar:
        rows = choose_rows(len(data), cfg.sft.batch_size, cfg.train.seed, "warmup", step)
        st = sft_train(h, Batch(data.select(rows).data), CallContext(cfg, step, tok, algo="sft"),
                       Place(micro_batches=cfg.ppo.micro_batches))
        records.append({"step": step, **st})
        bar.set_postfix(loss=f"{st['sft/loss']:.3f}")
    what = f"demonstrations from {cfg.sft.path}" if cfg.sft.path else "noisy demonstrations"
    log(f"SFT warm-up: {cfg.sft.steps} steps of {cfg.sft.batch_size} {what}, "
        f"loss {records[0]['sft/loss']:.3f} -> {records[-1]['sft/loss']:.3f}")
    return records
