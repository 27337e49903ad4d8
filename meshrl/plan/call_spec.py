"""The nouns the estimator speaks (pure data): a run's shape, a call's spec, which links a placement
spans, and an estimate of time and memory. Kept apart from the cost formulas (estimator.py)."""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field, replace

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
    # Multi-turn rollouts (env.fn): gen_len is then the whole trajectory after the prompt
    # (env.max_tokens) and gen_len_mean its expected tokens; generation runs ``turns`` turns of up to
    # ``turn_len`` tokens (``turn_len_mean`` expected), each followed by ``obs_len`` observation
    # tokens. turn_len None: one turn.
    turns: float = 1.0
    turn_len: int | None = None
    turn_len_mean: float | None = None
    obs_len: float = 0.0
    # RL actor train calls recompute the batch's log-probs first where their values are used (one
    # forward, no grad: under vLLM PPO's old log-probs, decoupled PPO, the rollout correction;
    # Config.trainer_logprobs_needed, meshrl/algo/mismatch.py); an engine with its
    # own weights (gen.backend=vllm) loads them before generating and keeps a second copy
    recompute_actor: bool = False
    engine_copy: bool = False
    # The runtime settings that change a train call's time or memory (PRICED below), as the
    # runtime's ParallelModel gets them (meshrl/runtime/roles.py)
    grad_bucket_bytes: float = 25 * 2**20  # train.grad_bucket_mb: the dp all-reduce / ZeRO-1 gather bucket
    overlap_grad_reduce: bool = True  # train.overlap_grad_reduce: buckets all-reduced during the backward
    activation_checkpointing: bool = False  # train.activation_checkpointing: layers recomputed in the backward
    compile_layers: bool = False  # train.compile: the layers' cache-free forwards and backward compiled
    compile_gen: bool = False  # gen.compile (meshrl's engine): the decoding steps and the prefill compiled
    # train.stream_steps under lag k (Config.stream_steps_at): a batch's generation is k segments, one a
    # version, each re-prefilling the prompt and the tokens so far (meshrl/plan/stream.py); 0: whole
    stream_steps: int = 0
    stream_lag: int = 0

    @classmethod
    def from_config(cls, cfg) -> "RunShape":
        shape = cls._sizes(cfg)
        vllm = getattr(getattr(cfg, "gen", None), "backend", "meshrl") == "vllm"
        # vLLM: paged and compacting. The actor's train call recomputes the batch's log-probs where
        # they are used (Config.trainer_logprobs_needed)
        rl = getattr(cfg, "algo", "") in ("ppo", "grpo", "remax", "rloo")
        needed = getattr(cfg, "trainer_logprobs_needed", None)
        rl = rl and (needed() if needed is not None else True)
        train = getattr(cfg, "train", None)
        runtime = {} if train is None else {
            "grad_bucket_bytes": train.grad_bucket_mb * 2**20, "overlap_grad_reduce": train.overlap_grad_reduce,
            "activation_checkpointing": train.activation_checkpointing, "compile_layers": train.compile is True}
        gen = getattr(cfg, "gen", None)
        if gen is not None:
            runtime["compile_gen"] = gen.compile is True and not vllm  # vLLM compiles its own way, unpriced here
        # (auto is priced eager until the run resolves it: plan/compile_choice.py)
        return dataclasses.replace(shape, recompute_actor=rl, engine_copy=vllm, compact=shape.compact or vllm,
                                   **runtime)

    @classmethod
    def _sizes(cls, cfg) -> "RunShape":
        ppo, d = getattr(cfg, "ppo", None), cfg.data
        env = getattr(cfg, "env", None)
        if env is None or not env.fn:
            return cls(d.prompt_len, d.gen_len, d.batch_size, d.samples_per_prompt, getattr(ppo, "epochs", 1),
                       getattr(ppo, "mini_batches", 1), d.gen_len_mean, d.gen_len_longest)
        turns = d.turns_mean if d.turns_mean is not None else float(env.max_turns)
        obs = d.obs_len_mean if d.obs_len_mean is not None else 0.0
        turn_mean = d.gen_len_mean if d.gen_len_mean is not None else float(d.gen_len)
        traj = min(float(env.max_tokens), turns * turn_mean + (turns - 1) * obs)
        return cls(d.prompt_len, env.max_tokens, d.batch_size, d.samples_per_prompt, getattr(ppo, "epochs", 1),
                   getattr(ppo, "mini_batches", 1), traj, None, turns=turns, turn_len=d.gen_len,
                   turn_len_mean=turn_mean, obs_len=obs)

    def turn_shapes(self) -> list[tuple[float, "RunShape"]]:
        """(weight, the shape of one turn's generation) for each turn of a multi-turn rollout: turn
        k prefills the whole conversation so far, P + k x (turn_len_mean + obs_len) tokens (the
        engine keeps no cache between turns), then decodes up to turn_len; a fractional expected
        turn count weighs the last turn by its fraction. One turn: [(1, self)]."""
        if self.stream_steps and self.stream_lag:
            return self._segments()
        if self.turn_len is None:
            return [(1.0, self)]
        step = (self.turn_len_mean or self.turn_len) + self.obs_len
        out, k = [], 0
        while k < self.turns:
            w = min(1.0, self.turns - k)
            out.append((w, replace(self, prompt_len=round(self.prompt_len + k * step), gen_len=self.turn_len,
                                   gen_len_mean=self.turn_len_mean, gen_len_longest=None, turns=1.0,
                                   turn_len=None)))
            k += 1
        return out

    def _segments(self) -> list[tuple[float, "RunShape"]]:
        """Streaming: a batch's S decode steps at each of the k - 1 versions after its admission,
        then the rest at the bound, each segment re-prefilling prompt + tokens so far (as
        runtime/stream.py runs them; rows ending early are priced as running on)."""
        s, k, out, done = self.stream_steps, self.stream_lag, [], 0
        for i in range(k):
            steps = self.gen_len - done if i == k - 1 else min(s, self.gen_len - done)
            if steps <= 0:
                break
            out.append((1.0, replace(self, prompt_len=self.prompt_len + done, gen_len=steps, gen_len_mean=None,
                                     gen_len_longest=None, stream_steps=0, stream_lag=0)))
            done += steps
        return out

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
    (optimizer state, train calls only) and ``transient`` (gradients, activations, KV cache).
    ``stage_transient``: the transient need of each pipeline stage where the stages differ (1F1B
    keeps pp - i micro-batches in flight on stage i; only the last stage holds the logits); empty:
    every stage needs ``transient``, which is always the largest of them. ``stage_share``: each
    stage's parameters over the largest stage's (the embedding on the first stage, the head on the
    last, the middle ones neither): a stage's weights and optimizer state are those of the busiest
    (``weights_bytes``, ``state_bytes``) times its share; empty: every stage holds as much."""

    time_s: float
    flops: float = 0.0
    weights_bytes: float = 0.0
    state_bytes: float = 0.0
    transient_bytes: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)
    # The share of the call's devices computing at any moment: with pp > 1 each stage idles in
    # the bubble, m / (m + pp - 1) busy for m micro-batches; generation's stages while a
    # micro-batch's tokens travel back (estimate_generate.decode_round).
    # Where devices share cores (CPU), the simulator counts a call's busy ranks by it.
    active: float = 1.0
    stage_transient: tuple[float, ...] = ()
    stage_share: tuple[float, ...] = ()

    @property
    def mem_bytes(self) -> float:
        return self.weights_bytes + self.state_bytes + self.transient_bytes

    def transient_on(self, stage: int) -> float:
        """The transient bytes on pipeline stage ``stage`` (0-based) of the call's layout."""
        return self.stage_transient[stage] if self.stage_transient else self.transient_bytes

    def resident_on(self, stage: int) -> float:
        """The weights and optimizer state on pipeline stage ``stage`` of the call's layout."""
        share = self.stage_share[stage] if self.stage_share else 1.0
        return (self.weights_bytes + self.state_bytes) * share

    def weights_on(self, stage: int) -> float:
        """The weights alone on pipeline stage ``stage`` (a temporary copy in this layout)."""
        return self.weights_bytes * (self.stage_share[stage] if self.stage_share else 1.0)


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


# Every setting that meshrl/runtime and meshrl/parallel read from cfg.train and cfg.gen, with where
# the planner prices it, or why it changes neither an iteration's time nor its memory.
# tests/plan/test_runtime_settings.py finds the keys the runtime reads and fails on one missing here.
PRICED = {
    "train.dtype": "bytes per weight, gradient and activation; the optimizer state (plan/problem.py, estimator.py)",
    "train.grad_bucket_mb": "collectives per dp all-reduce and ZeRO-1 gather, and the gather's buffer (estimator.py)",
    "train.overlap_grad_reduce": "the dp all-reduce hidden behind the last micro-batch's backward (estimator.py)",
    "train.activation_checkpointing": "layer inputs kept instead of activations; one more forward (estimator.py)",
    "train.off_policy": "generation of t+1 overlapping training of t (plan/simulator.py)",
    "train.threads": "a CPU profile's figures scaled to the rank's threads (plan/thread_scaling.py)",
    "train.stream_steps": "each version's segment of a streamed batch re-prefills prompt + tokens so far "
                          "(RunShape turn_shapes / _segments, from Config.stream_steps_at at the problem's lag)",
    "gen.backend": "vLLM's compacting engine, its weight copy and the log-prob recompute (RunShape.from_config)",
    "train.compile": "the layers' forward and forward + backward at the profile's compiled / eager factors, "
                     "where tp = 1 and the layers are dense (estimator.py; GPU presets: eager, hardware.py)",
    "gen.compile": "decoding steps and the prefill at the profile's compiled / eager factors, where tp = 1 "
                   "(estimator.py; GPU presets: eager, hardware.py)",
}
UNPRICED = {
    "train.iterations": "how many iterations run, not what one costs",
    "train.seed": "which numbers, not their cost",
    "train.save_every": "checkpoints are written between iterations, outside the iteration priced",
    "train.timeout": "a deadline for a hung rank, not a cost",
}
