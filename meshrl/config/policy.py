"""What the trained policy optimises: ``ppo`` (shared by ppo, grpo, remax and rloo), ``sft`` and
``dpo``. The loss variants and rollout-correction modes are the algorithm's names, checked where
they are defined (meshrl/algo/recipe_config.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from .fields import check_fields, setting


@dataclass
class PPOConfig:
    """Policy-gradient settings shared by ppo, grpo, remax and rloo (sizes are printed per run)."""

    epochs: int = setting(1, "passes over each iteration's samples", at_least=1)
    mini_batches: int = setting(2, "optimizer steps per epoch (the iteration's samples cut into this many)",
                                at_least=1)
    micro_batches: int = setting(1, "gradient-accumulation slices of a mini-batch (never changes results)",
                                 at_least=1)
    clip: float = setting(0.2, "policy ratio clip (the lower one when clip_high is set)", above=0, below=1)
    clip_high: float | None = setting(None, "upper ratio clip (DAPO's clip-higher); none = ppo.clip", at_least=0)
    dual_clip: float = setting(0.0, "dual-clip constant c > 1 (0 = off): a negative-advantage token's loss <= c|A|")
    ratio: str = setting("token", "token | sequence (GSPO's length-normalised sequence ratio)")
    loss_agg: str = setting("token-mean", "token-mean | seq-mean-token-mean | seq-mean-token-sum | "
                            "seq-mean-token-sum-norm")
    value_clip: float = setting(0.2, "critic value clip", above=0)
    gamma: float = setting(1.0, "discount of GAE (ppo)", at_least=0, at_most=1)
    lam: float = setting(0.95, "GAE lambda (ppo)", at_least=0, at_most=1)
    kl_coef: float = setting(0.02, "weight of the KL to the reference policy (0 = no KL term)", at_least=0)
    kl_mode: str = setting("auto", "reward (penalty in the reward) | loss (KL loss term) | auto: loss for grpo",
                           choices=("auto", "reward", "loss"))
    kl_estimator: str = setting("auto", "k1 | k2 | k3 | abs | auto: k1 in the reward, k3 as a loss",
                                choices=("auto", "k1", "k2", "k3", "abs"))
    entropy_coef: float = setting(0.0, "weight of the entropy bonus in the policy loss", at_least=0)
    moe_aux_coef: float = setting(0.0, "MoE actors: router load-balancing loss, mean over rows and MoE layers "
                                  "(model/moe.py)")
    whiten_advantages: bool = setting(True, "PPO: whiten GAE advantages over the mini-batch")
    normalize_rewards: bool = setting(False, "PPO/ReMax: whiten sequence scores over the iteration's batch")
    grpo_std: bool = setting(True, "GRPO: divide by the group's std (false = Dr. GRPO style)")
    rollout_is: str = setting("off", "rollout correction (docs/algorithms.md): off | token | sequence: truncated "
                              "importance weights pi_trainer / pi_engine")
    rollout_is_cap: float = setting(2.0, "the weights' upper bound (TRL's vllm_importance_sampling_cap default)",
                                    at_least=1, why="weights are truncated from above")
    rollout_mask_above: float | None = setting(None, "drop sequences whose mean k3 mismatch exceeds this (none: "
                                               "keep all)", above=0)
    decoupled: bool = setting(False, "decoupled PPO (AReaL): clip around the proximal policy (the actor before "
                              "this iteration's first update, recomputed by the trainer), each token weighted by "
                              "min(pi_prox / pi_behav, rollout_is_cap), pi_behav the policy that sampled it (any "
                              "version: train.off_policy=k)")

    def validate(self, name: str = "ppo") -> None:
        check_fields(self, name)
        if self.dual_clip != 0.0 and self.dual_clip <= 1.0:
            raise UserError(f"{name}.dual_clip must be 0 (off) or > 1, got {self.dual_clip}")


@dataclass
class SFTConfig:
    """Supervised fine-tuning: the whole stage for algo=sft, and the demo's warm-up before RL."""

    steps: int = setting(150, "optimizer steps of the warm-up (algo=sft uses train.iterations)", at_least=1)
    lr: float = setting(2e-3, "learning rate of the warm-up", above=0)
    batch_size: int = setting(64, "sequences per step", at_least=1)
    warmup: bool = setting(True, "RL starts with an SFT stage: on a preset actor with the task's SFT data (the "
                           "demo's, or sft.path), on a checkpoint actor (models.actor.path) with sft.path only")
    path: str | None = setting(None, "JSONL {\"prompt\", \"response\"} for the warm-up of a run with its own "
                               "data.path or model (without it such a run skips the warm-up: the demo's data never "
                               "mixes in)")

    def validate(self, name: str = "sft") -> None:
        check_fields(self, name)


@dataclass
class DPOConfig:
    beta: float = setting(0.1, "DPO's inverse temperature: the strength of the pull to the reference", above=0)

    def validate(self, name: str = "dpo") -> None:
        check_fields(self, name)
