"""Generation backends: the one interface the runtime's generation call runs on.

    gen = make_generator(backend, model_cfg, dtype, seed, max_len)   # once per rank and placement
    gen.load_weights(named_tensors)   # the rank's slices of the generation layout, in buckets
    out = gen.generate(prompts, gen_cfg, seeds)   # token ids in -> sampled ids + log-probs out

``gen.backend=meshrl`` is meshrl's own engine (meshrl/model/generation.py, pipelined and
tensor-parallel in meshrl/parallel/generate.py): it runs on the ParallelModel itself, so the
runtime needs no generator object and no weight load for it (``make_generator`` returns None).
``gen.backend=vllm`` is vLLM (meshrl/gen/vllm_engine.py): one in-process engine per data-parallel
replica of the generation layout, fed by meshrl's reallocation. The interface is deliberately
narrow (prompt token ids, GenerationConfig, per-row seeds -> GenerationOutput) so that single-turn
rollouts and multi-turn environments call it alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from ..model.config import ModelConfig
from ..model.generation import GenerationConfig, GenerationOutput
from .checks import BACKENDS, check_backend

__all__ = ["BACKENDS", "Generator", "check_backend", "close_all", "join", "make_generator"]
_OPEN: list = []  # this process's engines, closed by close_all before its process groups go


class Generator(Protocol):
    """A rollout engine that holds its own copy of the policy's weights."""

    def generate(self, prompts: list[list[int]], gen_cfg: GenerationConfig, seeds: list[int] | None = None,
                 micro_batches: int | None = None) -> GenerationOutput:
        """prompts (token ids, no padding) -> responses, response_logprobs, response_mask [B, N];
        log-probs of the raw model distribution (untempered, unfiltered), as meshrl's engine."""

    def load_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Replace the engine's weights with ``named`` (HF names, whole tensors of a tp=1 layout);
        returns the bytes loaded."""

    def close(self) -> None:
        """Release the engine."""


def make_generator(backend: str, model_cfg: ModelConfig, dtype: torch.dtype, seed: int, max_len: int
                   ) -> Generator | None:
    """This rank's engine for ``backend`` (None for meshrl's own engine, which is the model handle)."""
    if backend == "meshrl":
        return None
    from .vllm_engine import VllmGenerator  # optional: vLLM is an extra ('.[vllm]')

    gen = VllmGenerator(model_cfg, dtype, seed, max_len)
    _OPEN.append(gen)
    return gen


def join(backend: str) -> None:
    """Collective over the world, before any generator is made: the backend's own process groups
    (vLLM's), on every rank."""
    if backend != "meshrl":
        from .vllm_engine import join_groups  # optional: vLLM is an extra ('.[vllm]')

        join_groups()


def close_all() -> None:
    """Shut down every engine this process made (call before destroying the process groups)."""
    while _OPEN:
        _OPEN.pop().close()
