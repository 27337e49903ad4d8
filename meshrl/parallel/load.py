"""Slice loaders: each rank materialises only its own shards, never a whole model.

A ``SliceLoader(name, slice)`` returns one shard (a new CPU tensor, in the loader's dtype); the
``Stage`` builds its modules on the meta device and asks the loader for exactly the ShardMap slices
of its rank. Two sources:

- ``SafetensorsLoader``: a Hugging Face checkpoint directory; ``get_slice`` reads only the requested
  rows/columns from the file (memory-mapped), so a 70B checkpoint loads on a rank that holds 1/64 of it.
- ``InitLoader``: the seeded random init of ``build_model`` (same numbers, bit for bit): that init
  draws every tensor in HF order from one generator, so a tensor's values depend on all earlier
  draws; the loader streams the draws, one full tensor alive at a time, and keeps only the slice.
  Slices asked in HF order (the Stage's order) cost one pass over the draws.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch._guards import detect_fake_mode

from ..errors import UserError
from ..layout.shardmap import Slice
from ..model.checkpoint import _IGNORED_SUFFIXES, _check_shapes, _weight_files, init_tensor, read_config
from ..model.config import ModelConfig, param_shapes
from ..model.presets import get_preset


def _index(sl: Slice) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in sl)


def _fake_part(full: tuple[int, ...], sl: Slice, dtype: torch.dtype) -> torch.Tensor:
    """Under a fake mode (the dry run): a new tensor of slice ``sl`` of a ``full``-shaped parameter
    in ``dtype``, what a real load returns, in one fake op (no values to draw or read)."""
    return torch.empty([b - a for a, b in sl] + list(full[len(sl):]), dtype=dtype)


class InitLoader:
    """Shards of ``build_model(cfg, seed, value_head)`` without building it (see the module doc).
    ``only``: names this loader may be asked for (others may still be drawn, to keep the stream)."""

    def __init__(self, cfg: ModelConfig | str, seed: int, value_head: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
        self.cfg = get_preset(cfg) if isinstance(cfg, str) else cfg
        self.seed, self.dtype = seed, dtype
        self.shapes = param_shapes(self.cfg, value_head)
        self.order = list(self.shapes)
        self.index = {n: i for i, n in enumerate(self.order)}  # a MoE preset has ~20k names
        self._restart()

    def _restart(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)
        self.pos = 0  # index in self.order of the next tensor the generator will draw
        self.last: tuple[str, torch.Tensor] | None = None

    def __call__(self, name: str, sl: Slice) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(f"InitLoader: no parameter {name!r}")
        if detect_fake_mode() is not None:
            # a draw has no values and leaves the generator where it was: one fake op instead of a
            # draw, its slice, cast and copy (a MoE preset has ~20k tensors a model)
            return _fake_part(self.shapes[name], sl, self.dtype)
        if self.last is None or self.last[0] != name:
            want = self.index[name]
            if want < self.pos:
                self._restart()
            while self.pos <= want:  # draw (and drop) the tensors before it: the stream must advance
                n = self.order[self.pos]
                t = init_tensor(n, self.shapes[n], self.gen)
                self.pos += 1
            self.last = (name, t)
        return self.last[1][_index(sl)].to(self.dtype).clone()


class SafetensorsLoader:
    """Shards read straight from a checkpoint directory (checked like ``load_pretrained``: missing,
    unexpected and mis-shaped tensors are named). A value model from a causal-LM checkpoint gets a
    fresh ``score`` drawn as ``load_pretrained(..., value_head=True, seed=seed)`` draws it."""

    def __init__(self, path: str | os.PathLike, value_head: bool = False, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> None:
        self.cfg, _ = read_config(path)
        self.root, self.dtype, self.value_head = Path(path), dtype, value_head
        self.files = _weight_files(self.root)
        expected = param_shapes(self.cfg, value_head)
        on_disk = {n for n in self.files if not n.endswith(_IGNORED_SUFFIXES)}
        self.init_score = value_head and "score.weight" not in on_disk
        missing = [n for n in expected if n not in on_disk and not (self.init_score and n == "score.weight")]
        if missing:
            raise UserError(f"{self.root}: checkpoint lacks tensor {missing[0]!r}")
        tolerated = {"lm_head.weight"} if (self.cfg.tie_word_embeddings or value_head) else set()
        unexpected = sorted(on_disk - set(expected) - tolerated)
        if unexpected:
            raise UserError(f"{self.files[unexpected[0]]}: unexpected tensor {unexpected[0]!r} for a "
                            f"{self.cfg.model_type} model with this config.json")
        _check_shapes(self.files, expected)
        self.shapes, self.seed = expected, seed
        self._open: dict[Path, object] = {}

    def __call__(self, name: str, sl: Slice) -> torch.Tensor:
        if detect_fake_mode() is not None:  # the dry run reads nothing: shapes were checked above
            return _fake_part(self.shapes[name], sl, self.dtype)
        if name == "score.weight" and self.init_score:
            gen = torch.Generator().manual_seed(self.seed)
            return init_tensor(name, (1, self.cfg.hidden_size), gen)[_index(sl)].to(self.dtype)
        path = self.files[name]
        try:
            if path not in self._open:
                self._open[path] = safe_open(path, framework="pt")
            part = self._open[path].get_slice(name)[_index(sl)]
        except Exception as e:  # safetensors raises its own error types
            raise UserError(f"{path}: cannot read tensor {name!r} ({e})") from None
        # Always a new tensor: an open safetensors file hands out views of its one memory map, so
        # the roles built from one checkpoint (actor, ref, the critic's backbone) would share
        # storage, and each optimizer step would move them all (the ref's KL stayed 0 and the
        # critic trained the actor's weights: docs/runtime.md, "Determinism").
        out = torch.empty(part.shape, dtype=self.dtype)
        out.copy_(part)
        return out


class ValueFromCausal:
    """A value model over a causal LM's backbone: every backbone shard from ``body``; ``score``
    zero (a critic, so early values are 0) or from ``score`` (a reward model's random head)."""

    def __init__(self, body, score=None) -> None:
        self.body, self.score = body, score

    @property
    def dtype(self) -> torch.dtype:
        return self.body.dtype

    def __call__(self, name: str, sl: Slice) -> torch.Tensor:
        if name != "score.weight":
            return self.body(name, sl)
        if self.score is None:
            return torch.zeros(tuple(b - a for a, b in sl), dtype=self.dtype)
        return self.score(name, sl)


class StateLoader:
    """Shards cut from a full state dict (tests, and the demo's warm-up result)."""

    def __init__(self, state: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> None:
        self.state = state
        self.dtype = dtype or next(iter(state.values())).dtype

    def __call__(self, name: str, sl: Slice) -> torch.Tensor:
        return self.state[name][_index(sl)].to(self.dtype).clone().contiguous()
