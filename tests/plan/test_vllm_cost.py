"""What gen.backend=vllm adds to the estimator (meshrl/plan/estimator.py): the engine's weight load
before generating (the rank's weight bytes read and written once at memory bandwidth) and its
second copy of the weights; the trainer's recompute forward before the actor's update; vLLM's
paged cache (compact)."""

from dataclasses import replace

import pytest

from meshrl.config import load_config
from meshrl.model.presets import get_preset
from meshrl.plan.estimator import CallSpec, Links, RunShape, estimate_call
from meshrl.plan.hardware import PRESETS
from meshrl.layout.mesh import Layout

H100 = PRESETS["h100-80g"]
SEVEN = get_preset("llama2-7b")
SHAPE = RunShape(prompt_len=256, gen_len=256, batch_size=64, samples_per_prompt=4, mini_batches=2)


def test_the_engine_load_is_two_passes_over_the_weights_at_memory_bandwidth():
    lay = Layout(dp=2)
    base = estimate_call(CallSpec("g", "actor", "generate", SEVEN), SHAPE, lay, 1, H100, Links())
    got = estimate_call(CallSpec("g", "actor", "generate", SEVEN), replace(SHAPE, engine_copy=True), lay, 1, H100,
                        Links())
    assert got.weights_bytes == pytest.approx(2 * base.weights_bytes)  # meshrl's copy and the engine's
    assert got.breakdown["weight_sync"] == pytest.approx(2 * base.weights_bytes / H100.hbm_bw)
    assert got.time_s == pytest.approx(base.time_s + got.breakdown["weight_sync"])


def test_the_recompute_is_one_forward_of_the_batch():
    spec = CallSpec("t", "actor", "train", SEVEN)
    base = estimate_call(spec, SHAPE, Layout(dp=2), 1, H100, Links())
    got = estimate_call(spec, replace(SHAPE, recompute_actor=True), Layout(dp=2), 1, H100, Links())
    fwd = estimate_call(CallSpec("i", "actor", "inference", SEVEN), SHAPE, Layout(dp=2), 1, H100, Links())
    assert got.time_s - base.time_s == pytest.approx(fwd.time_s - H100.call_host_s)
    critic = estimate_call(CallSpec("t", "critic", "train", SEVEN, value_head=True),
                           replace(SHAPE, recompute_actor=True), Layout(dp=2), 1, H100, Links())
    assert "recompute" not in critic.breakdown


def test_the_config_sets_them_for_vllm_only():
    """The engine's copy and compaction are vLLM's; the recompute forward runs where its values are
    used (vLLM's old log-probs, decoupled PPO, the rollout correction), for the RL algorithms only:
    under meshrl's engine alone the mismatch comes from the first training forward (algo/mismatch.py)."""
    meshrl = RunShape.from_config(load_config(None, ["algo=grpo"]))
    vllm = RunShape.from_config(load_config(None, ["algo=grpo", "gen.backend=vllm"]))
    assert (meshrl.engine_copy, meshrl.recompute_actor, meshrl.compact) == (False, False, False)
    assert (vllm.engine_copy, vllm.recompute_actor, vllm.compact) == (True, True, True)
    for extra in ("ppo.decoupled=true", "ppo.rollout_is=token", "ppo.rollout_mask_above=0.1"):
        assert RunShape.from_config(load_config(None, ["algo=grpo", extra])).recompute_actor, extra
    assert not RunShape.from_config(load_config(None, ["algo=dpo"])).recompute_actor
