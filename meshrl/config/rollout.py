"""How responses are made and scored: ``gen`` (sampling and the generation backend), ``reward``,
``env`` (multi-turn rollouts) and ``eval`` (held-out evaluation). The reward rules, user functions
and environments are the algorithm's to check (meshrl/algo/recipe_config.py), since checking them
imports user code."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import check_fields, check_switch, setting


@dataclass
class GenConfig:
    temperature: float = setting(1.0, "sampling temperature", above=0)
    top_k: int = setting(0, "sample from the k most likely tokens only; 0 = all", at_least=0)
    top_p: float = setting(1.0, "nucleus sampling: the smallest set of tokens whose probability reaches top_p",
                           above=0, at_most=1)
    compile: bool | str = setting("auto", "decode steps (fixed shapes) and the prefill's layers (dynamic shapes) "
                                  "through torch.compile: same tokens, faster after a one-off compile (docs/model.md). "
                                  "auto: on where the planner predicts that the run saves more than the compile "
                                  "costs (as train.compile)")
    backend: str = setting("meshrl", "meshrl (our exact engine) | vllm (vLLM engines, one per dp replica; "
                           "docs/vllm.md)", choices=("meshrl", "vllm"))

    def validate(self, name: str = "gen") -> None:
        check_fields(self, name)
        check_switch(self.compile, f"{name}.compile")


@dataclass
class RewardConfig:
    """Where rewards come from: models.reward.path (a trained reward model), else this rule."""

    rule: str = setting("exact_match", "a function registered with meshrl.algo.rewards.register_rule")
    fn: list[str] = setting(help="user functions: file.py:name or module:name (one or a list)", factory=list)
    weights: list[float] = setting(help="one per reward.fn; default 1 each", factory=list)
    overlong_buffer: int = setting(0, "DAPO overlong shaping: the last this many of data.gen_len tokens are "
                                   "penalised")
    overlong_penalty: float = setting(1.0, "the penalty at a response of data.gen_len tokens")

    def validate(self, name: str = "reward") -> None:
        check_fields(self, name)


@dataclass
class EnvConfig:
    """Multi-turn rollouts (meshrl/algo/env.py): the policy talks with an environment of yours."""

    fn: str | None = setting(None, "file.py:Name or module:Name; Name(row) has reset() and step(response)")
    max_turns: int = setting(4, "policy turns per trajectory at most (each up to data.gen_len tokens)", at_least=1)
    max_tokens: int = setting(128, "tokens of a whole trajectory after the prompt (policy + observations)",
                              at_least=1)
    obs_role: str = setting("user", "the chat-template role of a text observation (e.g. \"tool\", \"user\")")

    def validate(self, name: str = "env") -> None:
        check_fields(self, name)


@dataclass
class EvalConfig:
    """Evaluation on held-out prompts while training (the actor's policy at the iteration's start)."""

    path: str | None = setting(None, "JSONL or Parquet of {\"prompt\" (or \"messages\"), \"answer\"}; "
                               "none = no evaluation")
    every: int = setting(10, "iterations between evaluations (iteration 0 is always evaluated)",
                         at_least=1, unit="iterations")
    samples: int = setting(1, "1 = greedy accuracy; k > 1 = k samples per prompt, eval/pass@k", at_least=1)
    correct: float = setting(1.0, "a response counts as correct when its reward is >= this (the rules give 1)")

    def validate(self, name: str = "eval") -> None:
        check_fields(self, name)
