"""The config sections: each validates itself (types, ranges, choices, rules between its fields),
validation changes nothing, and the algorithm's defaults are filled in once, by load_config."""

from __future__ import annotations

import copy

import pytest

from meshrl.config import (Config, DataConfig, PPOConfig, TrainConfig, load_config, own_model, role_spec,
                           with_algo_defaults)
from meshrl.config.fields import leaf_fields
from meshrl.errors import UserError


@pytest.mark.parametrize("algo,samples", [("ppo", 1), ("remax", 1), ("grpo", 4), ("rloo", 4), ("sft", 1)])
def test_samples_per_prompt_defaults_to_the_algorithms(algo, samples):
    assert load_config(None, [f"algo={algo}"]).data.samples_per_prompt == samples
    assert load_config(None, [f"algo={algo}", "data.samples_per_prompt=3"]).data.samples_per_prompt == 3


def test_validation_changes_nothing():
    for cfg in (Config(algo="grpo"), load_config(None, ["algo=rloo", "ppo.clip=0.3"]), Config()):
        before = copy.deepcopy(cfg)
        cfg.validate()
        assert cfg == before
    unset = Config(algo="grpo")
    filled = with_algo_defaults(unset)
    assert unset.data.samples_per_prompt is None and filled.data.samples_per_prompt == 4


def test_a_group_of_one_is_refused_not_rewritten():
    with pytest.raises(UserError, match=r"data.samples_per_prompt=1: algo=grpo needs >= 2"):
        load_config(None, ["algo=grpo", "data.samples_per_prompt=1"])


@pytest.mark.parametrize("section,name,message", [
    (DataConfig(batch_size="8"), "data", "config key data.batch_size must be int, got '8'"),
    (DataConfig(batch_size=0), "data", "config key data.batch_size must be >= 1, got 0"),
    (DataConfig(gen_len=8, gen_len_mean=9.0), "data", "data.gen_len_mean=9.0 must be between 1 and data.gen_len=8"),
    (TrainConfig(dtype="int8"), "train", "train.dtype='int8' is not one of auto, float32, bfloat16, float64"),
    (TrainConfig(compile=1), "train", "config key train.compile must be true, false or auto, got 1"),
    (TrainConfig(timeout=float("nan")), "train", "config key train.timeout must be a finite number, got nan"),
    (PPOConfig(clip=1.0), "ppo", "config key ppo.clip must be > 0 and < 1, got 1.0"),
    (PPOConfig(dual_clip=0.5), "ppo", "ppo.dual_clip must be 0 (off) or > 1, got 0.5"),
    (PPOConfig(gamma=1.5), "ppo", "config key ppo.gamma must be >= 0 and <= 1, got 1.5"),
])
def test_each_section_checks_its_own_keys(section, name, message):
    with pytest.raises(UserError) as e:
        section.validate(name)
    assert str(e.value) == message
    with pytest.raises(UserError) as whole:  # the same message through the whole config
        Config(**{name: section}).validate()
    assert str(whole.value) == message


def test_defaults_are_valid_and_every_key_is_declared_with_help():
    Config().validate()
    for key, (f, _, _) in leaf_fields(Config()).items():
        assert f.metadata.get("help"), key


def test_a_role_without_a_model_of_its_own_is_the_actor_s():
    """config/models.py own_model / role_spec: what the runtime builds and the planner prices."""
    m = load_config(None, ["models.actor=small"]).models
    assert not own_model(m, "critic") and role_spec(m, "critic") is m.actor  # unset
    m = load_config(None, ["models.actor=small", "models.critic=small", "models.ref=tiny"]).models
    assert not own_model(m, "critic") and own_model(m, "ref") and role_spec(m, "ref").preset == "tiny"
    m = load_config(None, ["models.actor.path=/ckpt", "models.critic=tiny"]).models
    assert own_model(m, "critic") and role_spec(m, "ref").path == "/ckpt"
