"""The ``data`` section: the prompts, the sizes of an iteration's batch, and the planner's expected lengths."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from .fields import check_fields, setting

GROUP_ALGOS = ("grpo", "rloo")  # a group baseline: every prompt needs several samples
GROUP_SAMPLES = 4  # their default group size (the demo's and examples/smollm2's)


def default_samples_per_prompt(algo: str) -> int:
    """The responses per prompt when ``data.samples_per_prompt`` is unset: 4 for grpo and rloo (a group
    of one has no baseline), 1 for every other algorithm."""
    return GROUP_SAMPLES if algo in GROUP_ALGOS else 1


@dataclass
class DataConfig:
    prompt_len: int = setting(16, "maximum prompt tokens", at_least=1)
    gen_len: int = setting(16, "maximum generated tokens per response", at_least=1)
    gen_len_mean: float | None = setting(None, "planner only: expected response length (none: every response "
                                         "runs to gen_len); meshrl plan --lengths-from OUT/ reads it from a run")
    gen_len_longest: float | None = setting(None, "planner only: expected longest response of a "
                                            "generation batch (none: gen_len); meshrl plan --lengths-from OUT/ reads "
                                            "it from a run")
    turns_mean: float | None = setting(None, "planner only, multi-turn (env.fn): expected policy turns per "
                                       "trajectory (none: env.max_turns); meshrl plan --lengths-from OUT/ reads it "
                                       "(env/turns_mean)")
    obs_len_mean: float | None = setting(None, "planner only, multi-turn: expected observation tokens per turn "
                                         "(none: observations cost nothing); meshrl plan --lengths-from OUT/ reads "
                                         "it (env/obs_length)")
    batch_size: int = setting(32, "prompts per iteration (sft: sequences per step; rm/dpo: pairs per step)",
                              at_least=1)
    samples_per_prompt: int | None = setting(None, "responses sampled per prompt; none: the algorithm's default, "
                                             f"{GROUP_SAMPLES} for {' and '.join(GROUP_ALGOS)} (which need >= 2: a "
                                             "group of one has no baseline), 1 otherwise; the loaded config holds "
                                             "the count, and the run prints it", at_least=1)
    path: str | None = setting(None, "JSONL or Parquet dataset (docs/algorithms.md \"Data\"); none = the "
                               "built-in demo task")
    chat_template: bool = setting(False, "render each record through the actor checkpoint's chat template")
    prompt_key: str = setting("prompt", "the field that holds a record's prompt, in every dataset file of the run "
                              "(OpenRLHF's --input_key)")
    answer_key: str = setting("answer", "the field that holds a prompt record's reference answer (OpenRLHF's "
                              "--label_key)")
    filter_groups: bool = setting(False, "DAPO dynamic sampling: drop prompt groups whose rewards are all equal")
    filter_rounds: int = setting(3, "with filter_groups: prompts drawn = filter_rounds x batch_size, at most",
                                 at_least=1)

    def renames(self) -> tuple[tuple[str, str], ...]:
        """(the dataset's field, meshrl's) for each of prompt_key / answer_key set to another name."""
        return tuple((theirs, ours) for theirs, ours in ((self.prompt_key, "prompt"), (self.answer_key, "answer"))
                     if theirs != ours)

    def validate(self, name: str = "data") -> None:
        check_fields(self, name)
        for key in ("gen_len_mean", "gen_len_longest"):
            val = getattr(self, key)
            if val is not None and not 1 <= val <= self.gen_len:
                raise UserError(f"{name}.{key}={val} must be between 1 and {name}.gen_len={self.gen_len}")
