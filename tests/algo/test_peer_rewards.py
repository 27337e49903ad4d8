"""Reward functions written for verl (compute_score, per response) and for TRL (batched, over
completions) run unchanged through reward.fn, called as those trainers call them."""

from __future__ import annotations

import pytest

from meshrl.algo.user_rewards import load_reward_fn, score_texts
from meshrl.commands.settings import load_settings
from meshrl.errors import UserError

VERL = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "openai/gsm8k" and extra_info["split"] == "train"
    return 1.0 if solution_str.strip().endswith(ground_truth) else 0.0

def as_dict(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": float(len(solution_str)), "acc": True}

def no_score(data_source, solution_str, ground_truth):
    return {"acc": 1}
'''
TRL = '''
def accuracy(completions, solution, **kwargs):
    return [None if s == "skip" else float(c.strip() == s) for c, s in zip(completions, solution)]

def chat_accuracy(prompts, completions, answer, **kwargs):
    assert prompts[0][-1]["role"] == "user"
    return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

def too_few(completions, **kwargs):
    return [1.0]
'''


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "verl_rw.py").write_text(VERL)
    (tmp_path / "trl_rw.py").write_text(TRL)
    return tmp_path


def _scores(spec, responses, answers, rows, chat=False):
    cfg = load_settings(None, [f"reward.fn={spec}"])
    cfg.data.chat_template = chat  # (a chat run needs a checkpoint; only the flag matters here)
    where = [f"row {i}" for i in range(len(responses))]
    return score_texts(cfg, ["q"] * len(responses), responses, answers, rows, where)[0].tolist()


def test_verl_compute_score(files):
    rows = [{"data_source": "openai/gsm8k", "extra_info": {"split": "train"}}] * 2
    assert _scores(f"{files}/verl_rw.py:compute_score", ["so 7", "so 8"], ["7", "7"], rows) == [1.0, 0.0]
    assert _scores(f"{files}/verl_rw.py:as_dict", ["abc"], ["7"], rows[:1]) == [3.0]
    with pytest.raises(UserError, match='without "score"'):
        _scores(f"{files}/verl_rw.py:no_score", ["abc"], ["7"], rows[:1])


def test_trl_reward_functions_are_called_once_a_batch(files):
    rows = [{"solution": "7"}, {"solution": "8"}, {"solution": "skip"}]
    assert _scores(f"{files}/trl_rw.py:accuracy", ["7", "7", "7"], ["", "", ""], rows) == [1.0, 0.0, 0.0]
    assert load_reward_fn(f"{files}/trl_rw.py:accuracy").batched
    chat_rows = [{"messages": [{"role": "user", "content": "q"}]}, {}]
    assert _scores(f"{files}/trl_rw.py:chat_accuracy", ["7", "x"], ["7", "7"], chat_rows, chat=True) == [1.0, 0.0]
    with pytest.raises(UserError, match=r"too_few .* returned list of 1 for 2 completions"):
        _scores(f"{files}/trl_rw.py:too_few", ["a", "b"], ["", ""], [{}, {}])


def test_meshrl_functions_keep_their_convention(files):
    (files / "own.py").write_text("def f(prompt, response, answer, **row):\n    return float(response == answer)\n")
    assert _scores(f"{files}/own.py:f", ["7", "8"], ["7", "7"], [{}, {}]) == [1.0, 0.0]
    assert not load_reward_fn(f"{files}/own.py:f").batched
