"""The model-handle protocol the runtime's calls are written against, and its one-process version.

``ParallelModel`` (meshrl/parallel/model.py) is the multi-rank handle; ``LocalHandle`` gives a
plain ``CausalLM``/``ValueModel`` and its optimizer the same methods, so one implementation of each
call (meshrl/algo/calls.py) runs on one process or on any layout. Outputs follow the
ParallelModel contract: a forward's result is the rank's rows, or None on ranks that are not the
last pipeline stage.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol

import torch
from torch import nn

from ..model.generation import GenerationConfig, GenerationOutput, generate
from ..model.heads import HeadOutputs, pad_head, split_micro, trim_columns
from ..model.moe import set_moe_aux
from ..model.numerics import wide

LossFn = Callable[[HeadOutputs, Mapping[str, torch.Tensor]], torch.Tensor]


class ModelHandle(Protocol):
    """What a call may do with its role's model (shapes: B rows, S tokens)."""

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batches: int = 1,
                 entropy: bool = False) -> torch.Tensor | None:
        """log p(token t+1 | <= t) [B, S-1] float32."""

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batches: int = 1
               ) -> torch.Tensor | None:
        """values [B, S]."""

    def generate(self, prompts: list[list[int]], gen_cfg: GenerationConfig, seeds: list[int] | None = None,
                 micro_batches: int | None = None) -> GenerationOutput:
        """``micro_batches``: in flight through a pipeline (None: pp; one process: unused)."""

    def forward_backward(self, batch: Mapping[str, torch.Tensor], loss_fn: LossFn, micro_batches: int = 1,
                         entropy: bool = False, moe_aux: float = 0.0) -> float:
        """Accumulate the gradient of sum(loss_fn(micro)) over micro-batches; returns that sum.
        ``moe_aux`` > 0 adds a MoE model's router balance loss (model/moe.py ``set_moe_aux``)."""

    def optimizer_step(self) -> float:
        """Clip, step, zero the gradients; returns the gradient norm before clipping."""


class LocalHandle:
    """The handle protocol over one process's model (``value_head``: a ValueModel)."""

    def __init__(self, model: nn.Module, optim: torch.optim.Optimizer | None = None,
                 grad_clip: float = 0.0) -> None:
        self.model, self.optim, self.grad_clip = model, optim, grad_clip

    def _head(self, mb: Mapping[str, torch.Tensor], entropy: bool) -> HeadOutputs:
        """The model on the micro-batch's real columns (model/heads.py), outputs padded back to the
        full width with zeros."""
        run, lo = trim_columns(mb)
        out = self.model(run["input_ids"], run["attention_mask"])
        width = mb["input_ids"].shape[1]
        if out.dim() == 2:  # a value model: [b, S']
            return pad_head(HeadOutputs(values=wide(out)), lo, width)
        logp_all = torch.log_softmax(wide(out[:, :-1]), -1)
        lp = logp_all.gather(-1, run["input_ids"][:, 1:, None]).squeeze(-1)
        ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
        return pad_head(HeadOutputs(logprobs=lp, entropy=ent), lo, width)

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batches: int = 1,
                 entropy: bool = False) -> torch.Tensor:
        self.model.eval()
        out = self._head({"input_ids": input_ids, "attention_mask": attention_mask}, entropy)
        return torch.stack([out.logprobs, out.entropy]) if entropy else out.logprobs

    @torch.no_grad()
    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batches: int = 1
               ) -> torch.Tensor:
        self.model.eval()
        return self._head({"input_ids": input_ids, "attention_mask": attention_mask}, False).values

    def generate(self, prompts: list[list[int]], gen_cfg: GenerationConfig, seeds: list[int] | None = None,
                 micro_batches: int | None = None) -> GenerationOutput:
        self.model.eval()
        return generate(self.model, prompts, gen_cfg, seeds)

    def forward_backward(self, batch: Mapping[str, torch.Tensor], loss_fn: LossFn, micro_batches: int = 1,
                         entropy: bool = False, moe_aux: float = 0.0) -> float:
        self.model.train()
        total = 0.0
        set_moe_aux(self.model, moe_aux)
        try:
            for mb in split_micro(batch, micro_batches):
                loss = loss_fn(self._head(mb, entropy), mb)
                loss.backward()
                total += float(loss.detach())
        finally:
            set_moe_aux(self.model, 0.0)
        return total

    def optimizer_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        return norm

