"""One rank's piece of a model: its pipeline stage's layers, holding its tensor-parallel shards.

The piece is built from the plain modules of meshrl/model/transformer.py (on the meta device, then
given real tensors), so it computes exactly what the single-process model computes. Which slice of
which parameter lives here comes from the ShardMap and nowhere else; ``param_of`` maps each HF name
the ShardMap gives this rank to the local ``nn.Parameter`` (layer indices are global in the names,
local in the module list).
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.utils.checkpoint
from torch import nn

from ..model.transformer import Backbone
from ..layout.shardmap import ShardMap, Slice
from .groups import RankGroups
from ..layout.mesh import stage_layers
from .tensor import VocabParallelEmbedding, register_tp_hooks

# full-tensor name -> the slice of it this rank needs (a loader may read only that slice from disk)
SliceLoader = Callable[[str, Slice], torch.Tensor]


def cut(full: torch.Tensor, sl: Slice) -> torch.Tensor:
    """The ShardMap slice of a full tensor, as a new contiguous tensor."""
    return full[tuple(slice(a, b) for a, b in sl)].clone().contiguous()


def loader_from_state(state: Mapping[str, torch.Tensor]) -> SliceLoader:
    """A SliceLoader over a full state dict (e.g. ``build_model(cfg, seed).state_dict()``)."""
    return lambda name, sl: cut(state[name], sl)


class Stage(nn.Module):
    """Layers ``layers`` of the model plus the embedding (first stage) and head (last stage).

    ``model`` is a Backbone whose ``embed_tokens``/``norm`` are None where this stage lacks them;
    ``head`` is ``lm_head`` (vocabulary-parallel) or ``score`` (replicated), or None."""

    def __init__(self, sm: ShardMap, groups: RankGroups, load: SliceLoader,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        cfg, lay = sm.cfg, sm.placement.layout
        _, tp_i, pp_i = groups.coords
        self.layers = stage_layers(cfg.num_hidden_layers, lay.pp)[pp_i]
        self.first, self.last = pp_i == 0, pp_i == lay.pp - 1
        self.value_head = sm.value_head
        self.vocab_start = tp_i * (cfg.vocab_size // lay.tp)
        self.groups = groups
        # Experts are sharded over the tp group (whole experts, E/tp each: ShardMap's rule); only
        # this rank's are built.
        per = cfg.num_experts // lay.tp if cfg.num_experts else 0
        self.expert_first = tp_i * per
        with torch.device("meta"):
            self.model = Backbone(cfg, self.layers, range(self.expert_first, self.expert_first + per))
            self.head: nn.Linear | None = None
            if self.last:
                self.head = nn.Linear(cfg.hidden_size, 1 if sm.value_head else cfg.vocab_size, bias=False)
        self.model.embed_tokens = None
        if not self.last:
            self.model.norm = None
        self.param_of: dict[str, nn.Parameter] = {}
        for name, sl in sm.params_of(groups.rank).items():
            self._place(name, load(name, sl).to(device))  # only this rank's slice, straight to its device
        missing = [n for n, p in self.named_parameters() if p.is_meta]
        if missing:  # a ShardMap / module mismatch: fail loudly rather than compute on meta tensors
            raise RuntimeError(f"rank {groups.rank}: parameters {missing} were not given a shard")
        register_tp_hooks(self.model.layers, None if sm.value_head else self.head, groups.tp)

    def _place(self, name: str, tensor: torch.Tensor) -> None:
        """Put the shard of HF parameter ``name`` where this stage's modules use it."""
        if name == "model.embed_tokens.weight":
            if self.first:
                if self.groups.tp.size == 1:
                    self.model.embed_tokens = nn.Embedding.from_pretrained(tensor, freeze=False)
                else:
                    self.model.embed_tokens = VocabParallelEmbedding(tensor, self.vocab_start, self.groups.tp)
                param = self.model.embed_tokens.weight
                if self.last and self.head.weight.is_meta and not self.value_head:
                    self.head.weight = param  # tied, one stage: one parameter, autograd sums the uses
                self.param_of[name] = param
                return
            owner, attr = self.head, "weight"  # tied head on the last stage (pp > 1)
        elif name in ("lm_head.weight", "score.weight"):
            owner, attr = self.head, "weight"
        else:
            path = name.split(".")
            if path[1] == "layers":
                path[2] = str(int(path[2]) - self.layers.start)
                if len(path) > 5 and path[4] == "experts":  # global expert id -> index among the kept
                    path[5] = str(int(path[5]) - self.expert_first)
            owner = self.get_submodule(".".join(path[:-1]))
            attr = path[-1]
        param = nn.Parameter(tensor)
        setattr(owner, attr, param)
        self.param_of[name] = param

    def checkpoint_activations(self) -> None:
        """``train.activation_checkpointing``: each layer keeps only its input for the backward and
        recomputes the rest there (one more forward per layer, activations of one layer alive
        instead of all). Only with gradients on and no KV cache: inference and generation run as
        before. A recomputed layer repeats its tp all-reduces, in the same order on every tp rank."""
        for layer in self.model.layers:
            def run(*args, _fwd=layer.forward):
                if torch.is_grad_enabled() and args[4] is None:  # (h, cos, sin, mask, cache, ...)
                    return torch.utils.checkpoint.checkpoint(_fwd, *args, use_reentrant=False)
                return _fwd(*args)
            layer.forward = run

    @property
    def lm_head(self) -> nn.Linear | None:
        """``head`` under CausalLM's name for it, so that a one-stage model runs generation's own
        decode step (``generation.decode_and_pick``: ``model.model`` then ``model.lm_head``)."""
        return self.head

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.param_of.values())).dtype

    @property
    def device(self) -> torch.device:
        return next(iter(self.param_of.values())).device

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor, caches: list | None = None,
                start: int = 0, layer_fn=None, last_only: bool = False) -> torch.Tensor:
        """x: input_ids [B, S] (first stage) or hidden [B, S, hidden]; attention_mask [B, start+S].
        -> hidden [B, S, hidden] (normed on the last stage; the head is applied by the caller).
        ``layer_fn``, ``last_only``: Backbone.forward's."""
        return self.model(x, attention_mask, caches, start, layer_fn=layer_fn, last_only=last_only)
