"""How a run trains: the ``train`` section (iterations, precision, the runtime's knobs), ``optim``
(AdamW and its schedule) and ``replan`` (re-planning during a run). The LR schedule names are the
algorithm's (meshrl/algo/lr_schedule.py) and checked there (meshrl/algo/recipe_config.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from .fields import check_fields, check_switch, setting

DTYPES = ("auto", "float32", "bfloat16", "float64")


@dataclass
class TrainConfig:
    iterations: int = setting(20, "iterations of the algorithm (sft/rm/dpo: optimizer steps)", at_least=1)
    seed: int = setting(1, "the seed of every random choice (initialisation, sampling, shuffling)", at_least=0)
    threads: int = setting(0, "torch CPU threads per rank; 0 = auto: $OMP_NUM_THREADS if set, else the usable "
                           "cores split between the ranks on this machine (meshrl/cores.py; printed at the start "
                           "of a run)", at_least=0)
    off_policy: int | str = setting(0, "k >= 1: generation of iteration t+k runs while iteration t trains, from "
                                    "weights k updates old (k steps off-policy; a disaggregated plan then overlaps "
                                    "generation and training); auto: the planner picks k <= off_policy_max with the "
                                    "plan when the run starts (meshrl/plan/lag.py), written to OUT/config.yaml")
    off_policy_max: int = setting(4, "train.off_policy=auto: the largest lag the planner may choose", at_least=0)
    stream_steps: int | str = setting("auto", "S >= 1 (needs off_policy=k >= 1): streaming generation with partial "
                                      "rollouts; each batch is admitted k versions before it trains, decoded S tokens "
                                      "per version, its sequences in flight continuing under each new version's "
                                      "weights, and finished at the bound (the version before it trains); every token "
                                      "records its version (meshrl/plan/stream.py). 0: whole batches, each sampled by "
                                      "one version. auto: S = ceil(data.gen_len / k) where k >= 2 and meshrl's engine "
                                      "generates single-turn RL, else 0")
    save_every: int = setting(10, "write a checkpoint (OUT/ckpt-*, for --resume) every N iterations and after the "
                              "last; a resumed run redoes at most N-1 iterations, exactly (saving costs ~0.15 s on "
                              "the demo)", at_least=1)
    timeout: float = setting(300.0, "runtime (--nprocs / torchrun): seconds any collective, transfer or "
                             "reallocation may wait for another rank; a hanging rank ends the job after about "
                             "this long", above=0)
    dtype: str = setting("auto", "float32 | bfloat16 (bf16 weights/activations/grads, fp32 master + AdamW moments "
                         "sharded by ZeRO-1, fp32 log-probs and losses) | float64 (CPU: everything in float64, for "
                         "exact comparisons); auto: bfloat16 on CUDA and on CPUs with bf16 dot products "
                         "(AVX512-BF16, AMX), float32 on other CPUs", choices=DTYPES)
    activation_checkpointing: bool = setting(False, "recompute each layer's activations in the backward")
    grad_bucket_mb: float = setting(25.0, "data-parallel gradient all-reduce bucket, MiB (PyTorch DDP's default)",
                                    above=0)
    overlap_grad_reduce: bool = setting(True, "all-reduce each bucket as the last micro-batch's backward fills it")
    compile: bool | str = setting("auto", "decoder layers' forwards outside generation (training, reference / "
                                  "critic / reward inference) and their backward through torch.compile, where tp = 1: "
                                  "fused elementwise work, after a one-off compile (meshrl/model/compiled_layers.py; "
                                  "gen.compile: decoding). auto: on where the planner predicts that the run saves more "
                                  "than the compile costs, from the factors and compile times meshrl profile "
                                  "measured (meshrl/plan/compile_choice.py); off where nothing measured them")

    def validate(self, name: str = "train") -> None:
        check_fields(self, name)
        for key in ("off_policy", "stream_steps"):
            v = getattr(self, key)
            if (isinstance(v, str) and v != "auto") or (isinstance(v, int) and v < 0):
                raise UserError(f"{name}.{key}={v!r} must be a whole number >= 0 or auto")
        check_switch(self.compile, f"{name}.compile")


@dataclass
class OptimConfig:
    """AdamW for every trained role (betas 0.9/0.95, as most RLHF recipes)."""

    lr: float = setting(1e-3, "actor learning rate in the RL stage (and for dpo); the demo's tiny model", above=0)
    critic_lr: float = setting(1e-3, "critic (PPO) and reward model (algo=rm) learning rate", above=0)
    weight_decay: float = setting(0.0, "AdamW's decoupled weight decay", at_least=0)
    grad_clip: float = setting(1.0, "max global grad norm; 0 = off", at_least=0)
    schedule: str = setting("constant", "constant | linear | cosine (meshrl/algo/lr_schedule.py)")
    warmup: int = setting(0, "optimizer steps of linear warm-up", at_least=0, unit="optimizer steps")
    min_lr_ratio: float = setting(0.0, "linear / cosine decay down to min_lr_ratio x lr at the last step",
                                  at_least=0, at_most=1)

    def validate(self, name: str = "optim") -> None:
        check_fields(self, name)


@dataclass
class ReplanConfig:
    """Re-planning during a run (meshrl/runtime/replan.py; --replan-every N sets ``every``)."""

    every: int = setting(0, "iterations between re-plans (refit each call's cost from the run, search, maybe "
                         "switch plans through the resharding checkpoint); 0 = never", at_least=0)
    min_gain: float = setting(0.1, "switch when the refitted estimate of the searched plan is more than this "
                              "fraction faster than the current plan's (0.1: 1.1x)", at_least=0)
    search_steps: int = setting(2000, "plan evaluations of each re-plan's search (rank 0; the others wait)",
                                at_least=1)

    def validate(self, name: str = "replan") -> None:
        check_fields(self, name)
