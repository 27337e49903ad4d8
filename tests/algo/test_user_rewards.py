"""User reward functions (reward.fn), weights, overlong shaping and the recipe keys' validation."""

import pytest
import torch

from meshrl.algo.user_rewards import load_reward_fn, overlong_penalty, part_names, score_texts
from meshrl.commands.settings import load_settings
from meshrl.errors import UserError

USER_FILE = '''
def length_bonus(prompt, response, answer, **row):
    return len(response) * row.get("scale", 1.0)

def exact(prompt, response, answer, **row):
    return float(response.strip() == answer)

def boom(prompt, response, answer, **row):
    raise ValueError("no way")

def text(prompt, response, answer, **row):
    return "yes"
'''


@pytest.fixture()
def user_file(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text(USER_FILE)
    return f


def test_file_functions_weighted_and_named(user_file):
    cfg = load_settings(None, [f"reward.fn=[{user_file}:length_bonus, {user_file}:exact]", "reward.weights=[0.5, 2]"])
    score, parts = score_texts(cfg, ["p", "q"], ["abc", "7"], ["7", "7"], [{"scale": 2.0}, {}], ["row 0", "row 1"])
    # row 0: length_bonus = 3 * 2 = 6, exact = 0 -> 0.5*6 + 2*0 = 3; row 1: 1, 1 -> 0.5 + 2 = 2.5
    assert parts.tolist() == [[6.0, 0.0], [1.0, 1.0]]
    assert score.tolist() == [3.0, 2.5]
    assert part_names(cfg) == ["length_bonus", "exact"]


def test_module_spec_loads_a_package_function():
    f = load_reward_fn("meshrl.algo.rewards:numeric_distance")
    assert f.fn("3", "5") == pytest.approx(0.8)


def test_bad_reward_specs_are_refused_naming_the_key(user_file, tmp_path):
    with pytest.raises(UserError, match=r"reward.fn='nope.py:f': file nope.py not found"):
        load_settings(None, ["reward.fn=nope.py:f"])
    with pytest.raises(UserError, match=r"has no function 'missing'"):
        load_settings(None, [f"reward.fn={user_file}:missing"])
    with pytest.raises(UserError, match=r"reward.fn='no_such_pkg_xyz:f': cannot import module"):
        load_settings(None, ["reward.fn=no_such_pkg_xyz:f"])
    with pytest.raises(UserError, match="reward.weights has 1 entries but reward.fn has 2"):
        load_settings(None, [f"reward.fn=[{user_file}:exact, {user_file}:exact]", "reward.weights=[1]"])
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(UserError, match="importing .*broken.py failed: SyntaxError"):
        load_settings(None, [f"reward.fn={broken}:f"])


def test_user_function_failures_name_function_file_and_row(user_file):
    cfg = load_settings(None, [f"reward.fn={user_file}:boom"])
    with pytest.raises(UserError, match=r"reward function boom \(.*my_rewards.py\) raised ValueError: no way on "
                                        r"dataset row 4"):
        score_texts(cfg, ["p"], ["r"], ["a"], [{}], ["dataset row 4"])
    cfg = load_settings(None, [f"reward.fn={user_file}:text"])
    with pytest.raises(UserError, match=r"reward function text .* returned 'yes', not a finite number, on row 0"):
        score_texts(cfg, ["p"], ["r"], ["a"], [{}], ["row 0"])


def test_overlong_penalty_by_hand():
    # N = 16, buffer 4: lengths <= 12 free; 14 -> -(2/4) * 1.5 = -0.75; 16 -> -1.5
    got = overlong_penalty(torch.tensor([5, 12, 14, 16]), 16, 4, 1.5)
    assert got.tolist() == [0.0, 0.0, -0.75, -1.5]


@pytest.mark.parametrize("override,key", [
    ("ppo.loss_agg=mean", "ppo.loss_agg"), ("ppo.ratio=seq", "ppo.ratio"), ("ppo.dual_clip=0.5", "ppo.dual_clip"),
    ("ppo.clip_high=-1", "ppo.clip_high"), ("optim.schedule=step", "optim.schedule"),
    ("optim.warmup=-1", "optim.warmup"), ("optim.min_lr_ratio=2", "optim.min_lr_ratio"),
    ("ppo.kl_estimator=k4", "ppo.kl_estimator"), ("eval.every=0", "eval.every"), ("eval.samples=0", "eval.samples"),
    ("eval.path=/nope.jsonl", "eval.path"), ("data.filter_rounds=0", "data.filter_rounds"),
    ("reward.overlong_buffer=99", "reward.overlong_buffer"), ("data.chat_template=true", "data.chat_template"),
    ("reward.weights=[x]", "reward.weights[0]"), ("reward.rule=nope", "reward.rule"),
])
def test_bad_recipe_values_name_the_key(override, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        load_settings(None, [override])


def test_a_file_reward_equal_to_the_rule_trains_identically(tmp_path):
    """The demo's GRPO with reward.fn = a file's copy of exact_match gives the built-in rule's run,
    figure for figure (the file run adds reward/exact)."""
    from meshrl.observe.metrics import deterministic_part
    from meshrl.runtime.job import in_process
    from meshrl.runtime.plans import resolve_plan

    f = tmp_path / "mine.py"
    f.write_text("def exact(prompt, response, answer, **row):\n"
                 "    return 1.0 if response.strip() == answer.strip() else 0.0\n")
    base = ["algo=grpo", "data.batch_size=8", "train.iterations=2", "sft.steps=20", "data.gen_len=6"]
    cfgs = [load_settings(None, base + extra) for extra in ([], [f"reward.fn={f}:exact"])]
    runs = [in_process(c, resolve_plan(c, "colocated", 1)[0], None) for c in cfgs]  # `meshrl train`'s one rank
    for rule, mine in zip(*runs, strict=True):
        mine = deterministic_part(mine)
        assert mine.pop("reward/exact") == rule["reward/mean"]
        assert mine == deterministic_part(rule)
    assert runs[0][0]["reward/mean"] > 0  # a case where the reward says something
