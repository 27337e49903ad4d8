"""The nouns the estimator speaks (pure data): a run's shape, a call's spec, which links a placement
spans, and an estimate of time and memory. Kept apart from the cost formulas (estimator.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..layout.mesh import Layout, Mesh
from ..model.config import ModelConfig


@dataclass(frozen=True)
class RunShape:
    """The run's sizes: prompts per iteration and token lengths; PPO's optimizer steps.

    Responses are a distribution: ``gen_len`` is the budget (the maximum), ``gen_len_mean`` the
    expected length and ``gen_len_longest`` the expected longest row of a generation batch (both
    None: every response runs to the budget). The engine decides which one a call pays for:
    meshrl's runtime (model/generation.decode_loop) decodes a batch until its longest row ends,
    every row computing to the end, and hands on sequences padded to it; an engine that compacts
    (``compact``: finished rows leave the batch, training packs sequences, as vLLM / TensorRT-LLM
    in-flight batching and packed training do) pays for the mean per row and for the longest in steps."""

    prompt_len: int
    gen_len: int
    batch_size: int  # prompts per iteration
    samples_per_prompt: int = 1
    epochs: int = 1
    mini_batches: int = 1  # optimizer steps per epoch
    gen_len_mean: float | None = None
    gen_len_longest: float | None = None
    compact: bool = False

    @classmethod
    def from_config(cls, cfg) -> "RunShape":
        ppo = getattr(cfg, "ppo", None)
        return cls(cfg.data.prompt_len, cfg.data.gen_len, cfg.data.batch_size, cfg.data.samples_per_prompt,
                   getattr(ppo, "epochs", 1), getattr(ppo, "mini_batches", 1),
                   getattr(cfg.data, "gen_len_mean", None), getattr(cfg.data, "gen_len_longest", None))

    @property
    def seq_len(self) -> int:
        """Tokens of the longest possible sequence (memory is sized for it)."""
        return self.prompt_len + self.gen_len

    @property
    def mean_len(self) -> float:
        """Expected generated tokens per response."""
        return min(self.gen_len, self.gen_len_mean if self.gen_len_mean is not None else self.gen_len)

    def longest(self, rows: int) -> float:
        """Expected generated tokens of the longest of ``rows`` responses: the mean for one row, the
        measured longest if known, else the budget (a batch waits for its longest row, and with
        only a mean known the planner takes the safe side)."""
        if rows <= 1:
            return self.mean_len
        if self.gen_len_longest is not None:
            return max(self.mean_len, min(self.gen_len, self.gen_len_longest))
        return float(self.gen_len)

    def row_len(self, rows: int) -> float:
        """Tokens per sequence that a call over ``rows`` sequences computes: prompt + the mean when
        rows are compacted (packed), else prompt + the longest (padding)."""
        return self.prompt_len + (self.mean_len if self.compact else self.longest(rows))


@dataclass(frozen=True)
class CallSpec:
    """What the estimator needs to know about a call: its kind, its model, its sequence count."""

    name: str
    role: str
    kind: str  # generate | inference | train
    model: ModelConfig
    value_head: bool = False
    n_samples: int = 1

    def sequences(self, shape: RunShape) -> int:
        return shape.batch_size * (self.n_samples if self.n_samples > 1 else shape.samples_per_prompt)


@dataclass(frozen=True)
class Links:
    """Whether the TP, DP and PP groups of a placement cross node boundaries (IB instead of NVLink)."""

    tp: bool = False
    dp: bool = False
    pp: bool = False


@dataclass
class Estimate:
    """Predicted cost of one call (or one realloc / transfer step, with memory fields zero).

    Memory is per device on the call's busiest device: ``weights`` in this call's layout, ``state``
    (optimizer state, train calls only) and ``transient`` (gradients, activations, KV cache)."""

    time_s: float
    flops: float = 0.0
    weights_bytes: float = 0.0
    state_bytes: float = 0.0
    transient_bytes: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)
    # The share of the call's devices computing at any moment: with pp > 1 each stage idles in
    # the bubble, m / (m + pp - 1) busy for m micro-batches; generation's stages while a
    # micro-batch's tokens travel back (estimator._decode_round).
    # Where devices share cores (CPU), the simulator counts a call's busy ranks by it.
    active: float = 1.0

    @property
    def mem_bytes(self) -> float:
        return self.weights_bytes + self.state_bytes + self.transient_bytes


def mesh_links(mesh: Mesh, layout: Layout, devices_per_node: int) -> Links:
    """Which groups of the placement span nodes (checked on the first group of each axis; meshes
    are aligned blocks, so every group of an axis looks alike)."""
    r = mesh.ranks

    def spans(idxs: list[int]) -> bool:
        return len({r[i] // devices_per_node for i in idxs}) > 1

    lay = layout
    return Links(tp=spans([lay.local_index(0, t, 0) for t in range(lay.tp)]),
                 dp=spans([lay.local_index(d, 0, 0) for d in range(lay.dp)]),
                 pp=spans([lay.local_index(0, 0, p) for p in range(lay.pp)]))
