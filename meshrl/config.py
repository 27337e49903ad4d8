"""The run configuration: typed dataclasses, read from YAML and overridden by dotted ``key=value``.

One config system for every tool (train, plan, check): a key means one thing everywhere, and an
unknown key is an error naming the key, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .config_checks import check_ranges
from .errors import UserError

ALGOS = ("ppo", "grpo", "remax", "rloo", "dpo", "sft", "rm")


@dataclass
class ModelSpec:
    """A model for one role: a size preset (random init, for planning/benchmarks) or a local HF dir."""

    preset: str | None = None
    path: str | None = None


@dataclass
class ModelsConfig:
    actor: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))
    critic: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))
    ref: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))
    reward: ModelSpec = field(default_factory=lambda: ModelSpec(preset="tiny"))


@dataclass
class DataConfig:
    prompt_len: int = 16  # maximum prompt tokens
    gen_len: int = 16  # maximum generated tokens per response
    gen_len_mean: float | None = None  # planner only: expected response length (None: every response runs
    # to gen_len); `meshrl plan --lengths-from OUT/` reads it from a run
    gen_len_longest: float | None = None  # planner only: expected longest response of a generation batch
    # (None: gen_len); `meshrl plan --lengths-from OUT/` reads it from a run
    turns_mean: float | None = None  # planner only, multi-turn (env.fn): expected policy turns per
    # trajectory (None: env.max_turns); `meshrl plan --lengths-from OUT/` reads it (env/turns_mean)
    obs_len_mean: float | None = None  # planner only, multi-turn: expected observation tokens per turn
    # (None: observations cost nothing); `meshrl plan --lengths-from OUT/` reads it (env/obs_length)
    batch_size: int = 32  # prompts per iteration (sft: sequences per step; rm/dpo: pairs per step)
    samples_per_prompt: int = 1  # responses sampled per prompt; grpo/rloo need >= 2, and 1 means 4 there
    path: str | None = None  # JSONL dataset; None = the built-in demo task
    chat_template: bool = False  # render each record through the actor checkpoint's chat template
    filter_groups: bool = False  # DAPO dynamic sampling: drop prompt groups whose rewards are all equal
    filter_rounds: int = 3  # with filter_groups: prompts drawn = filter_rounds x batch_size, at most


@dataclass
class ClusterConfig:
    nodes: int = 1
    devices_per_node: int = 1
    device: str = "cpu"  # a100-80g | h100-80g | h200 | cpu (measured by `meshrl profile`)


@dataclass
class TrainConfig:
    iterations: int = 20
    seed: int = 1
    threads: int = 0  # torch CPU threads per rank; 0 = auto: $OMP_NUM_THREADS if set, else the usable
    # cores split between the ranks on this machine (meshrl/cores.py; printed at the start of a run)
    off_policy: int | str = 0  # k >= 1: generation of iteration t+k runs while iteration t trains, from
    # weights k updates old (k steps off-policy; a disaggregated plan then overlaps generation and
    # training); auto: the planner picks k <= off_policy_max with the plan, when the run starts
    off_policy_max: int = 4  # train.off_policy=auto: the largest lag the planner may choose
    save_every: int = 10  # write a checkpoint (OUT/ckpt-*, for --resume) every N iterations and after
    # the last; a resumed run redoes at most N-1 iterations, exactly (saving costs ~0.15 s on the demo)
    timeout: float = 300.0  # runtime (--nprocs / torchrun): seconds any collective, transfer or
    # reallocation may wait for another rank; a hanging rank ends the job after about this long
    dtype: str = "auto"  # float32 | bfloat16 (bf16 weights/activations/grads, fp32 master + AdamW
    # moments sharded by ZeRO-1, fp32 log-probs and losses) | float64 (CPU: everything in float64, for
    # exact comparisons); auto: bfloat16 on CUDA, float32 on a CPU
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward
    grad_bucket_mb: float = 25.0  # data-parallel gradient all-reduce bucket, MiB (PyTorch DDP's default)
    overlap_grad_reduce: bool = True  # all-reduce each bucket as the last micro-batch's backward fills it
    compile: bool = False  # decoder layers' forwards outside generation (training, reference / critic /
    # reward inference) and their backward through torch.compile, where tp = 1: fused elementwise work,
    # after a one-off compile of ~20-40 s on a CPU (meshrl/model/compiled_layers.py; gen.compile: decoding)


@dataclass
class OptimConfig:
    """AdamW for every trained role (betas 0.9/0.95, as most RLHF recipes)."""

    lr: float = 1e-3  # actor learning rate in the RL stage (and for dpo); the demo's tiny model
    critic_lr: float = 1e-3  # critic (PPO) and reward model (algo=rm)
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    schedule: str = "constant"  # constant | linear | cosine (meshrl/algo/lr_schedule.py)
    warmup: int = 0  # optimizer steps of linear warm-up
    min_lr_ratio: float = 0.0  # linear / cosine decay down to min_lr_ratio x lr at the last step


@dataclass
class PPOConfig:
    """Policy-gradient settings shared by ppo, grpo, remax and rloo (sizes are printed per run)."""

    epochs: int = 1  # passes over each iteration's samples
    mini_batches: int = 2  # optimizer steps per epoch (the iteration's samples cut into this many)
    micro_batches: int = 1  # gradient-accumulation slices of a mini-batch (never changes results)
    clip: float = 0.2  # policy ratio clip (the lower one when clip_high is set)
    clip_high: float | None = None  # upper ratio clip (DAPO's clip-higher); None = ppo.clip
    dual_clip: float = 0.0  # dual-clip constant c > 1 (0 = off): a negative-advantage token's loss <= c|A|
    ratio: str = "token"  # token | sequence (GSPO's length-normalised sequence ratio)
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    value_clip: float = 0.2  # critic value clip
    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.02
    kl_mode: str = "auto"  # reward (penalty in the reward) | loss (KL loss term) | auto: loss for grpo
    kl_estimator: str = "auto"  # k1 | k2 | k3 | abs | auto: k1 in the reward, k3 as a loss
    entropy_coef: float = 0.0
    moe_aux_coef: float = 0.0  # MoE actors: router load-balancing loss, mean over rows and MoE layers (model/moe.py)
    whiten_advantages: bool = True  # PPO: whiten GAE advantages over the mini-batch
    normalize_rewards: bool = False  # PPO/ReMax: whiten sequence scores over the iteration's batch
    grpo_std: bool = True  # GRPO: divide by the group's std (False = Dr. GRPO style)
    rollout_is: str = "off"  # rollout correction (docs/algorithms.md): off | token | sequence: truncated
    # importance weights pi_trainer / pi_engine
    rollout_is_cap: float = 2.0  # the weights' upper bound (TRL's vllm_importance_sampling_cap default)
    rollout_mask_above: float | None = None  # drop sequences whose mean k3 mismatch exceeds this (None: keep all)
    decoupled: bool = False  # decoupled PPO (AReaL): clip around the proximal policy (the actor before this
    # iteration's first update, recomputed by the trainer), each token weighted by min(pi_prox / pi_behav,
    # rollout_is_cap), pi_behav the policy that sampled it (any version: train.off_policy=k)


@dataclass
class GenConfig:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    compile: bool = False  # decode steps (fixed shapes) and the prefill's layers (dynamic shapes)
    # through torch.compile: same tokens, faster after a one-off compile of about a minute on a CPU
    # (docs/model.md has the measurements)
    backend: str = "meshrl"  # meshrl (our exact engine) | vllm (vLLM engines, one per dp replica; docs/vllm.md)


@dataclass
class SFTConfig:
    """Supervised fine-tuning: the whole stage for algo=sft, and the demo's warm-up before RL."""

    steps: int = 150  # optimizer steps of the warm-up (algo=sft uses train.iterations)
    lr: float = 2e-3
    batch_size: int = 64  # sequences per step
    warmup: bool = True  # RL from a preset actor starts with an SFT stage on the task's SFT data
    path: str | None = None  # JSONL {"prompt", "response"} for the warm-up of a run with its own
    # data.path (without it such a run skips the warm-up: the demo's data never mixes in)


@dataclass
class DPOConfig:
    beta: float = 0.1


@dataclass
class RewardConfig:
    """Where rewards come from: models.reward.path (a trained reward model), else this rule."""

    rule: str = "exact_match"  # a function registered with meshrl.algo.rewards.register_rule
    fn: list[str] = field(default_factory=list)  # user functions: file.py:name or module:name (one or a list)
    weights: list[float] = field(default_factory=list)  # one per reward.fn; default 1 each
    overlong_buffer: int = 0  # DAPO overlong shaping: the last this many of data.gen_len tokens are penalised
    overlong_penalty: float = 1.0  # the penalty at a response of data.gen_len tokens


@dataclass
class EnvConfig:
    """Multi-turn rollouts (meshrl/algo/env.py): the policy talks with an environment of yours."""

    fn: str | None = None  # file.py:Name or module:Name; Name(row) has reset() and step(response)
    max_turns: int = 4  # policy turns per trajectory at most (each up to data.gen_len tokens)
    max_tokens: int = 128  # tokens of a whole trajectory after the prompt (policy + observations)
    obs_role: str = "user"  # the chat-template role of a text observation (e.g. "tool", "user")


@dataclass
class EvalConfig:
    """Evaluation on held-out prompts while training (the actor's policy at the iteration's start)."""

    path: str | None = None  # JSONL of {"prompt" (or "messages"), "answer"}; None = no evaluation
    every: int = 10  # iterations between evaluations (iteration 0 is always evaluated)
    samples: int = 1  # 1 = greedy accuracy; k > 1 = k samples per prompt, eval/pass@k
    correct: float = 1.0  # a response counts as correct when its reward is >= this (the rules give 1)


@dataclass
class ReplanConfig:
    """Re-planning during a run (meshrl/runtime/replan.py; --replan-every N sets ``every``)."""

    every: int = 0  # iterations between re-plans (refit each call's cost from the run, search, maybe
    # switch plans through the resharding checkpoint); 0 = never
    min_gain: float = 0.1  # switch when the refitted estimate of the searched plan is more than this
    # fraction faster than the current plan's (0.1: 1.1x)
    search_steps: int = 2000  # plan evaluations of each re-plan's search (rank 0; the others wait)


@dataclass
class Config:
    algo: str = "ppo"
    models: ModelsConfig = field(default_factory=ModelsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    gen: GenConfig = field(default_factory=GenConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    replan: ReplanConfig = field(default_factory=ReplanConfig)

    def validate(self) -> None:
        if self.algo not in ALGOS:
            raise UserError(f"algo={self.algo!r} is not one of {', '.join(ALGOS)}")
        for name in ("nodes", "devices_per_node"):
            if getattr(self.cluster, name) < 1:
                raise UserError(f"cluster.{name} must be >= 1, got {getattr(self.cluster, name)}")
        if self.algo in ("grpo", "rloo") and self.data.samples_per_prompt == 1:
            self.data.samples_per_prompt = 4  # a group of one has no baseline; 4 is the default
        lag = self.train.off_policy
        if (isinstance(lag, str) and lag != "auto") or (isinstance(lag, int) and lag < 0):
            raise UserError(f"train.off_policy={lag!r} must be a whole number >= 0 or auto")
        if self.train.dtype not in ("auto", "float32", "bfloat16", "float64"):
            raise UserError(f"train.dtype={self.train.dtype!r} is not one of auto, float32, bfloat16, float64")
        if self.ppo.kl_mode not in ("auto", "reward", "loss"):
            raise UserError(f"ppo.kl_mode={self.ppo.kl_mode!r} is not one of auto, reward, loss")
        if self.ppo.kl_estimator not in ("auto", "k1", "k2", "k3", "abs"):
            raise UserError(f"ppo.kl_estimator={self.ppo.kl_estimator!r} is not one of auto, k1, k2, k3, abs")
        for key, val in (("data.batch_size", self.data.batch_size), ("data.gen_len", self.data.gen_len),
                         ("data.prompt_len", self.data.prompt_len), ("ppo.epochs", self.ppo.epochs),
                         ("ppo.mini_batches", self.ppo.mini_batches),
                         ("ppo.micro_batches", self.ppo.micro_batches),
                         ("data.samples_per_prompt", self.data.samples_per_prompt)):
            if val < 1:
                raise UserError(f"{key} must be >= 1, got {val}")
        for key in ("gen_len_mean", "gen_len_longest"):
            val = getattr(self.data, key)
            if val is not None and not 1 <= val <= self.data.gen_len:
                raise UserError(f"data.{key}={val} must be between 1 and data.gen_len={self.data.gen_len}")
        check_ranges(self)  # every other key's range (meshrl/config_checks.py)


def _field_types(cls) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _coerce(value: object, tp: object, key: str) -> object:
    """Convert a YAML/CLI value to the annotated type, or raise UserError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        for tp_i in args[:-1]:  # int | str: a number where it reads as one, else the word
            try:
                return _coerce(value, tp_i, key)
            except UserError:
                continue
        return _coerce(value, args[-1], key)
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
                return bool(value)
            raise ValueError(value)  # 2, 0.5, a list: not a yes or a no
        if typing.get_origin(tp) is list:
            items = [] if value is None else value if isinstance(value, list) else [value]
            (item_tp,) = typing.get_args(tp)
            return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(items)]
        if tp in (int, float, str):
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return tp(value)
    except (TypeError, ValueError):
        raise UserError(f"config key {key}: cannot read {value!r} as {getattr(tp, '__name__', tp)}") from None
    return value


def _apply(obj: object, data: dict, prefix: str = "") -> None:
    hints = _field_types(type(obj))
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in hints:
            known = ", ".join(f"{prefix}{n}" for n in hints)
            raise UserError(f"unknown config key {key!r}; known keys here: {known}")
        cur = getattr(obj, k)
        if dataclasses.is_dataclass(cur):
            if isinstance(v, str) and isinstance(cur, ModelSpec):  # models.actor=small shorthand
                v = {"path": v} if ("/" in v or Path(v).exists()) else {"preset": v}
            if not isinstance(v, dict):
                raise UserError(f"config key {key} must be a mapping, got {v!r}")
            _apply(cur, v, key + ".")
        else:
            setattr(obj, k, _coerce(v, hints[k], key))


def parse_overrides(items: list[str]) -> dict:
    """["a.b=1", "c=x"] -> nested dict {"a": {"b": "1"}, "c": "x"} (values parsed as YAML scalars)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            val = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            val = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = val
    return out


def load_config(path: str | None = None, overrides: list[str] | None = None, cls=Config) -> Config:
    """Defaults <- YAML file <- dotted overrides; validated. Errors name the file or the key."""
    cfg = cls()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise UserError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise UserError(f"config file {path} must hold a mapping at the top level")
        _apply(cfg, data)
    _apply(cfg, parse_overrides(overrides or []))
    cfg.validate()
    return cfg


def to_dict(cfg: object) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: object) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
