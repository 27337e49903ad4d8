"""DAPO's dynamic sampling (Yu et al. 2025): train only on prompt groups whose rewards differ.

With ``data.filter_groups=true`` an iteration draws ``data.filter_rounds x data.batch_size``
prompts (``rollout_batch``), generates and scores all of them, and the train calls keep
``data.batch_size`` groups: the first groups (in draw order) whose n rewards are not all equal,
then, when fewer than batch_size are, as many equal-reward groups as fill the batch (in draw
order). Under GRPO and RLOO an equal-reward group has advantage 0, so it adds only the KL and
entropy terms: the batch keeps its size (so every plan that fits the run fits it) and the update
is the one of the informative groups. ``batch/kept_groups`` counts the informative groups kept,
``batch/generated_groups`` the groups generated.

verl draws further batches until full (``max_num_gen_batches``) and stops the job when it cannot
fill; here all rounds are drawn at once, a fixed amount of work per iteration that a static plan
can schedule.
"""

from __future__ import annotations

import torch

from .batch import Batch


def group_rows(scores: torch.Tensor, n: int, want: int) -> tuple[torch.Tensor, int]:
    """scores [G * n] (prompt-major groups of n) -> (rows to keep [want * n] long, informative
    groups kept). A group is informative when max - min of its scores > 0."""
    g = scores.float().view(-1, n)
    varied = (g.max(-1).values - g.min(-1).values) > 0
    informative = varied.nonzero().flatten()[:want]
    filler = (~varied).nonzero().flatten()[:max(0, want - len(informative))]
    groups = torch.cat([informative, filler]).sort().values  # draw order, so the batch stays prompt-major
    rows = (groups[:, None] * n + torch.arange(n)).flatten()
    return rows, len(informative)


def filter_groups(batch: Batch, cfg) -> tuple[Batch, dict[str, float]]:
    """The train calls' batch under data.filter_groups (else the batch as is) and the metrics."""
    if not cfg.data.filter_groups:
        return batch, {}
    n = cfg.data.samples_per_prompt
    rows, kept = group_rows(batch["scores"], n, cfg.data.batch_size)
    return Batch(batch.select(rows).data), {"batch/kept_groups": float(kept),
                                            "batch/generated_groups": float(len(batch) // n)}


def prompts_per_iteration(cfg) -> int:
    """Prompts an iteration draws: batch_size, times filter_rounds under data.filter_groups."""
    return cfg.data.batch_size * (cfg.data.filter_rounds if cfg.data.filter_groups else 1)
