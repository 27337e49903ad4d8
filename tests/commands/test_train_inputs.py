"""Every input is checked before anything trains or is written, and a user's run never gets the
demo's data (issue 18, item 4)."""

import json

import pytest

from meshrl.cli import main

FAST = ["train.iterations=1", "sft.steps=2", "data.batch_size=4", "sft.batch_size=4", "--no-progress"]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" if r is not None else "\n" for r in rows))
    return path


@pytest.fixture
def prompts(tmp_path):
    return write(tmp_path / "prompts.jsonl", [{"prompt": "2+2=", "answer": "4"}, {"prompt": "Hi?", "answer": "yo"}])


def refused(capsys, out, *argv) -> str:
    assert main(["train", *argv, *FAST, "--out", str(out)]) == 2
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "SFT warm-up:" not in cap.out  # before any training
    assert not out.exists()  # nothing written
    return cap.err


def test_bad_inputs_are_named_before_the_warm_up(tmp_path, capsys, prompts):
    out = tmp_path / "run"
    long = write(tmp_path / "long.jsonl", [{"prompt": "1+1=", "answer": "2"}, None,
                                           {"prompt": "x" * 40, "answer": "1"}])
    assert f"{long}:3: prompt is 41 tokens, more than data.prompt_len=16" in refused(capsys, out, f"data.path={long}")
    bad_sft = write(tmp_path / "sft.jsonl", [{"prompt": "a", "response": "b"}, {"prompt": "a"}])
    err = refused(capsys, out, f"data.path={prompts}", f"sft.path={bad_sft}")
    assert f"{bad_sft}:2: missing key(s) ['response']" in err
    empty_dir = tmp_path / "model"
    empty_dir.mkdir()
    (empty_dir / "config.json").write_text("{}")
    assert "models.actor.path" in refused(capsys, out, f"models.actor.path={empty_dir}")
    assert "reward rule 'nope'" in refused(capsys, out, "reward.rule=nope")
    assert "plan file not found" in refused(capsys, out, "--plan", str(tmp_path / "missing.json"), "--nprocs", "2")
    assert "--plan: unknown strategy 'fastest'" in refused(capsys, out, "--plan", "fastest")
    assert "--nprocs must be >= 1" in refused(capsys, out, "--nprocs", "0")


def test_a_users_run_never_trains_on_demo_data(tmp_path, capsys, prompts):
    out = tmp_path / "run"
    assert main(["train", f"data.path={prompts}", *FAST, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SFT warm-up skipped" in printed and "sft.path" in printed and "SFT warm-up:" not in printed
    sft = write(tmp_path / "sft.jsonl", [{"prompt": "2+2=", "response": "4"}] * 3)
    assert main(["train", f"data.path={prompts}", f"sft.path={sft}", *FAST, "--out", str(tmp_path / "b")]) == 0
    assert f"SFT warm-up: 2 steps of 4 demonstrations from {sft}" in capsys.readouterr().out


def test_bringing_an_actor_skips_the_warm_up_with_a_note(tmp_path, capsys):
    assert main(["train", "algo=sft", *FAST, "--out", str(tmp_path / "sft")]) == 0
    capsys.readouterr()
    assert main(["train", f"models.actor.path={tmp_path / 'sft/actor'}", *FAST, "--out", str(tmp_path / "ppo")]) == 0
    printed = capsys.readouterr().out
    assert "SFT warm-up skipped: the actor is your checkpoint" in printed and "SFT warm-up:" not in printed
    assert "sft.path=FILE.jsonl" in printed


def test_an_actor_of_ones_own_warms_up_on_the_sft_path_given(tmp_path, capsys, prompts):
    """sft.path with models.actor.path: the warm-up starts from that checkpoint (not a preset's
    init), and RL, its reference included, starts from the warmed-up weights."""
    from safetensors.torch import load_file

    # another seed than the run's: a warm-up from the preset's init would start far from this actor
    assert main(["train", "algo=sft", "train.seed=7", *FAST, "--out", str(tmp_path / "sft")]) == 0
    actor = tmp_path / "sft/actor"
    sft = write(tmp_path / "demos.jsonl", [{"prompt": "2+2=", "response": "4"}, {"prompt": "Hi?", "response": "yo"}])
    capsys.readouterr()
    out = tmp_path / "grpo"
    assert main(["train", "algo=grpo", f"models.actor.path={actor}", f"data.path={prompts}", f"sft.path={sft}",
                 *FAST, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"SFT warm-up: 2 steps of 4 demonstrations from {sft}" in printed, printed
    base, warmed = load_file(actor / "model.safetensors"), load_file(out / "sft-warmup/model.safetensors")
    assert sorted(base) == sorted(warmed)
    moved = [k for k in base if not (base[k] == warmed[k]).all()]
    # two AdamW steps at sft.lr (2e-3) move a weight by about 2 x 2e-3 at most
    assert moved and max((warmed[k].float() - base[k].float()).abs().max().item() for k in moved) < 0.02


def test_rewards_that_never_differ_are_named_as_the_cause(tmp_path, capsys, prompts):
    """The 2-prompt run of the issue: every sample scored 0, so every advantage was 0."""
    assert main(["train", f"data.path={prompts}", *FAST, "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "every sample got the same reward (0)" in printed and "reward.rule" in printed
