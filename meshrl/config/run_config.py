"""The whole run's config: one section per concern, assembled. Each section validates its own keys
(its ``validate``); :meth:`Config.validate` calls them and holds the rules between sections."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import UserError
from .data import GROUP_ALGOS, DataConfig
from .fields import setting
from .models import ClusterConfig, ModelsConfig
from .policy import DPOConfig, PPOConfig, SFTConfig
from .rollout import EnvConfig, EvalConfig, GenConfig, RewardConfig
from .train import OptimConfig, ReplanConfig, TrainConfig

ALGOS = ("ppo", "grpo", "remax", "rloo", "dpo", "sft", "rm")


@dataclass
class Config:
    algo: str = setting("ppo", "the algorithm: ppo | grpo | remax | rloo | dpo | sft | rm")
    models: ModelsConfig = setting(help="which model plays each role", factory=ModelsConfig)
    data: DataConfig = setting(help="prompts and batch sizes", factory=DataConfig)
    cluster: ClusterConfig = setting(help="the devices", factory=ClusterConfig)
    train: TrainConfig = setting(help="the run and the runtime", factory=TrainConfig)
    optim: OptimConfig = setting(help="AdamW and its schedule", factory=OptimConfig)
    ppo: PPOConfig = setting(help="policy-gradient settings", factory=PPOConfig)
    gen: GenConfig = setting(help="sampling and the generation backend", factory=GenConfig)
    sft: SFTConfig = setting(help="supervised fine-tuning", factory=SFTConfig)
    dpo: DPOConfig = setting(help="direct preference optimisation", factory=DPOConfig)
    reward: RewardConfig = setting(help="where rewards come from", factory=RewardConfig)
    eval: EvalConfig = setting(help="held-out evaluation", factory=EvalConfig)
    env: EnvConfig = setting(help="multi-turn rollouts", factory=EnvConfig)
    replan: ReplanConfig = setting(help="re-planning during a run", factory=ReplanConfig)

    def validate(self) -> None:
        """UserError naming the first bad key; changes nothing."""
        if self.algo not in ALGOS:
            raise UserError(f"algo={self.algo!r} is not one of {', '.join(ALGOS)}")
        for f in fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate(f.name)
        n = self.data.samples_per_prompt
        if self.algo in GROUP_ALGOS and n is not None and n < 2:
            raise UserError(f"data.samples_per_prompt={n}: algo={self.algo} needs >= 2 (a group of one has no "
                            "baseline); leave it unset for the default of 4")
        self._check_streaming()

    def _check_streaming(self) -> None:
        """train.stream_steps = S: partial rollouts of meshrl's engine, single-turn RL, under off_policy >= 1."""
        s = self.train.stream_steps
        if not s or s == "auto":
            return
        why = "it needs train.off_policy=k >= 1 (the versions a batch is streamed over)" \
            if self.train.off_policy == 0 else self._why_not_streamed()
        if why:
            raise UserError(f"train.stream_steps={s}: {why}")

    def _why_not_streamed(self) -> str | None:
        """Why this run's generation cannot stream (None: it can)."""
        if self.algo not in ("ppo", "grpo", "remax", "rloo"):
            return f"algo={self.algo} generates nothing"
        if self.gen.backend != "meshrl":
            return (f"partial rollouts need gen.backend=meshrl (gen.backend={self.gen.backend}: continuing a "
                    "sequence under new weights at a fixed decode step is not built for it); use "
                    "train.stream_steps=0, whole batches k versions old")
        if self.env.fn:
            return "multi-turn rollouts (env.fn) are generated whole; use train.stream_steps=0"
        return None

    def stream_steps_at(self, k: int) -> int:
        """The decode steps per policy version that generation streams at lag ``k`` (0: whole batches).
        ``auto`` streams where k >= 2 and the run can (``_why_not_streamed``), S = ceil(gen_len / k):
        a response's tokens split evenly over the k versions that sample it; at k = 1 a batch is
        admitted and finished under one version, so nothing would be in flight across an update."""
        s = self.train.stream_steps
        if s != "auto":
            return s if k else 0
        if k < 2 or self._why_not_streamed() is not None:
            return 0
        return -(-self.data.gen_len // k)

    def trainer_logprobs_needed(self) -> bool:
        """Whether the actor's train call recomputes the batch's log-probs with the trainer before its
        first update (one more forward over the whole batch, algo/mismatch.py): their values are used
        where another engine sampled (gen.backend other than meshrl: they become PPO's old log-probs),
        under decoupled PPO (the proximal policy) and for the rollout correction's weights or mask.
        Otherwise meshrl's engine computed the trainer's own network, and the mismatch figures come
        from the first mini-batch's training forward at no extra cost."""
        p = self.ppo
        return (self.gen.backend != "meshrl" or p.decoupled or p.rollout_is != "off"
                or p.rollout_mask_above is not None)
