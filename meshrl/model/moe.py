"""Sparse Mixture-of-Experts block of Qwen3-MoE and Mixtral, numerically matching transformers.

A router (``gate``, a bias-free [E, hidden] linear) scores every token; softmax in float32; each
token goes to its top-k experts, weighted by their probabilities (renormalised over the k when
``norm_topk_prob``; Mixtral always renormalises). Each expert is a SwiGLU MLP. Routing is per token
and deterministic, so it does not depend on how a batch is split.

``experts`` is an ``ExpertList``: a ModuleList (HF names ``experts.5.up_proj.weight``) whose forward
runs the experts it holds. A tensor-parallel stage keeps only its own experts in it (``first`` =
the global id of the first), and parallel/tensor.py wraps that forward in the f/g pair, so the
router stays outside the tensor-parallel region: it runs on the replicated input on every rank and
its gradient needs no extra reduction (see docs/parallel.md, "Experts").

Load-balancing loss (Switch Transformer eq. 4-6, transformers' ``load_balancing_loss_func``) per
sequence and per layer: ``E * sum_e f_e * P_e`` over the sequence's real tokens, where f_e is the
fraction of the sequence's top-k picks that went to expert e and P_e its mean router probability.
The per-sequence form (transformers pools the whole batch) keeps every row's term independent of
the rows beside it, so the loss is the same under every data-parallel and micro-batch split. Its
gradient is injected where the router is (``_AddAuxGrad``, as Megatron-LM does), so it needs no
path through the pipeline to the last stage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from . import worst_case
from .numerics import wide


class Expert(nn.Module):
    """One SwiGLU expert; attribute names are the family's (Qwen3-MoE: gate_proj/up_proj/down_proj,
    Mixtral: w1/w3/w2)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, f = cfg.hidden_size, cfg.moe_intermediate_size
        self.names = cfg.expert_names
        gate, up, down = self.names
        setattr(self, gate, nn.Linear(h, f, bias=False))
        setattr(self, up, nn.Linear(h, f, bias=False))
        setattr(self, down, nn.Linear(f, h, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(F.silu(gate(x)) * up(x))


class ExpertList(nn.ModuleList):
    """Experts ``first .. first + len(self) - 1`` of a layer (all of them in one process)."""

    def __init__(self, experts: list[Expert], first: int = 0) -> None:
        super().__init__(experts)
        self.first = first

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x [T, hidden], weights [T, k], idx [T, k] (global expert ids) -> the weighted sum of the
        held experts' outputs [T, hidden] (zero rows for tokens routed elsewhere)."""
        out = torch.zeros_like(x)
        hit = False
        for j, expert in enumerate(self):
            if worst_case.active():
                # A dry run: the most the router can send these experts is every token's k picks,
                # so the first min(k, held) of them take every token (pick j) and the rest none.
                # One expert at a time this is each expert's peak; a training forward keeps all
                # of them for the backward, so it is also the sum's worst case.
                if j >= idx.shape[1]:
                    continue
                rows = torch.arange(x.shape[0], device=x.device)
                slot = torch.full_like(rows, j)
            else:
                rows, slot = torch.where(idx == self.first + j)
            if rows.numel() == 0:
                continue
            hit = True
            y = expert(x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        if not hit and torch.is_grad_enabled():
            # No token came to these experts: still depend on x and weights (an exact 0 through
            # empty slices), so that a tensor-parallel rank's backward runs the same collectives
            # as its peers'.
            out = out + (x[:0].sum() + weights[:0].sum()).to(out.dtype)
        return out


class _AddAuxGrad(torch.autograd.Function):
    """Forward: ``x`` unchanged. Backward: ``x``'s gradient, plus d(aux)/d(aux) = 1 into ``aux``,
    so ``aux`` counts as a term of the loss whatever the rest of the graph is."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.aux_shape = aux.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return g, torch.ones(ctx.aux_shape, dtype=torch.float32, device=g.device)


def balance_loss_per_row(logits: torch.Tensor, top_k: int, token_mask: torch.Tensor) -> torch.Tensor:
    """Router logits [B, S, E], token_mask [B, S] (1 = real) -> load-balancing loss per row [B]:
    ``E * sum_e f_e * P_e`` over the row's real tokens (transformers' formula for one sequence)."""
    e = logits.shape[-1]
    probs = wide(logits).softmax(-1)  # [B, S, E]
    picks = F.one_hot(probs.topk(top_k, dim=-1).indices, e).sum(-2).float()  # [B, S, E] (k picks)
    m = token_mask.float()[..., None]
    n = m.sum(1).clamp(min=1)  # [B, 1]
    f = (picks * m).sum(1) / n  # [B, E]
    p = (probs * m).sum(1) / n
    return e * (f * p).sum(-1)


class SparseMoE(nn.Module):
    """``gate`` + ``experts``; ``forward(x [B, S, hidden]) -> [B, S, hidden]``.

    ``aux_weight`` > 0 (set by the trainer for a training forward) adds
    ``aux_weight * sum over rows of balance_loss_per_row`` to the loss being differentiated."""

    def __init__(self, cfg: ModelConfig, experts: range | None = None) -> None:
        """``experts``: the global ids of the experts to hold (a tensor-parallel stage's own), all
        by default."""
        super().__init__()
        self.top_k, self.norm_topk = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.float_weights = cfg.model_type == "mixtral"  # Mixtral keeps the weights in float32
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        held = range(cfg.num_experts) if experts is None else experts
        self.experts = ExpertList([Expert(cfg) for _ in held], first=held.start)
        self.aux_weight = 0.0
        self.num_moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (logits [T, E], top-k weights [T, k], top-k expert ids [T, k])."""
        logits = self.gate(x)
        probs = wide(logits).softmax(-1)
        top, idx = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            top = top / top.sum(-1, keepdim=True)
        return logits, top if self.float_weights else top.to(logits.dtype), idx

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, h = x.shape
        logits, weights, idx = self.route(x.reshape(-1, h))
        out = self.experts(x.reshape(-1, h), weights, idx).view(b, s, h)
        if self.aux_weight > 0 and torch.is_grad_enabled():
            mask = token_mask if token_mask is not None else torch.ones(b, s, device=x.device)
            per_row = balance_loss_per_row(logits.view(b, s, -1), self.top_k, mask)
            out = _AddAuxGrad.apply(out, self.aux_weight * per_row.sum())
        return out


def set_moe_aux(model: nn.Module, per_row: float) -> None:
    """Make a training forward of ``model`` (a whole model or a pipeline stage) add
    ``per_row / (number of MoE layers of the whole model) * sum over rows and layers`` of the
    balance loss; 0 turns it off. A caller passes ``coef / rows of the whole mini-batch``, so the
    term is ``coef x`` the mean over the mini-batch's rows and the model's MoE layers, whatever the
    micro-batch, data- and pipeline-parallel split."""
    for m in model.modules():
        if isinstance(m, SparseMoE):
            m.aux_weight = per_row / m.num_moe_layers
