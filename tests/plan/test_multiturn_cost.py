"""The planner prices a multi-turn generation call as the runtime runs it: one generation per turn,
each prefilling the conversation so far; and learns turns and observation lengths from a run."""

from __future__ import annotations

import json

import pytest

from meshrl.config import load_config
from meshrl.layout.mesh import Layout
from meshrl.plan.call_spec import CallSpec, RunShape
from meshrl.plan.estimator import estimate_call
from meshrl.plan.hardware_profile import get_hardware
from meshrl.plan.lengths import apply_lengths
from meshrl.model.presets import get_preset

SIZES = ["algo=grpo", "data.gen_len=16", "data.batch_size=8", "data.samples_per_prompt=2"]
ENV = SIZES + ["data.prompt_len=32", "env.fn=tests/algo/count_env.py:CountEnv", "env.max_turns=3",
               "env.max_tokens=96"]


def _gen(shape: RunShape):
    hw = get_hardware("h100-80g", 8)
    spec = CallSpec("actor_gen", "actor", "generate", get_preset("llama2-7b"))
    return estimate_call(spec, shape, Layout(1, 1, 1), 1, hw)


def test_turns_are_priced_as_one_turn_generations_over_the_growing_conversation():
    one = _gen(RunShape.from_config(load_config(None, SIZES + ["data.prompt_len=32"])))  # no env: one turn
    shape = RunShape.from_config(load_config(None, ENV + ["data.turns_mean=1"]))
    assert shape.gen_len == 96 and shape.turn_len == 16
    assert _gen(shape).time_s == pytest.approx(one.time_s)  # one expected turn = the single-turn call
    two = RunShape.from_config(load_config(None, ENV + ["data.turns_mean=2", "data.obs_len_mean=8",
                                                        "data.gen_len_mean=10"]))
    first = RunShape.from_config(load_config(None, SIZES + ["data.prompt_len=32", "data.gen_len_mean=10"]))
    later = RunShape.from_config(load_config(None, SIZES + ["data.prompt_len=50", "data.gen_len_mean=10"]))
    want = _gen(first).time_s + _gen(later).time_s  # turn 2 prefills 32 + 10 + 8 tokens
    assert _gen(two).time_s == pytest.approx(want)
    assert _gen(two).mem_bytes == pytest.approx(max(_gen(first).mem_bytes, _gen(later).mem_bytes))
    half = RunShape.from_config(load_config(None, ENV + ["data.turns_mean=1.5", "data.obs_len_mean=8",
                                                         "data.gen_len_mean=10"]))
    assert _gen(half).time_s == pytest.approx(_gen(first).time_s + 0.5 * _gen(later).time_s)
    assert two.mean_len == pytest.approx(2 * 10 + 8)  # the trajectory the train calls see


def test_lengths_from_a_multi_turn_run(tmp_path):
    rows = [{"iteration": i, "response/length": 20.0 + i, "response/length_max": 40.0, "env/turns_mean": 2.0,
             "env/obs_length": 7.0 + i} for i in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, ENV)
    apply_lengths(cfg, tmp_path)
    assert (cfg.data.turns_mean, cfg.data.obs_len_mean, cfg.data.gen_len_mean) == (2.0, 8.0, 10.5)
    assert cfg.data.gen_len_longest is None
    single = tmp_path / "single"
    single.mkdir()
    (single / "metrics.jsonl").write_text(json.dumps({"response/length": 5.0}) + "\n")
    with pytest.raises(Exception, match="no env/turns_mean"):
        apply_lengths(load_config(None, ENV), single)
