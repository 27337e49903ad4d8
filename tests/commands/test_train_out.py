"""`meshrl train --out DIR` never replaces an existing run silently, and what a run prints last."""

from meshrl.cli import main

TINY = ["train.iterations=1", "sft.steps=2", "data.batch_size=4", "sft.batch_size=8", "--no-progress"]


def snapshot(out):
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_an_existing_run_is_refused_then_replaced_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")  # not the run's: --overwrite must leave it
    before = snapshot(out)
    capsys.readouterr()
    assert main(["train", *TINY, "train.seed=2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err and "--out" in err
    assert "Traceback" not in err
    assert snapshot(out) == before  # nothing on disk changed

    assert main(["train", *TINY, "train.seed=2", "--out", str(out), "--overwrite"]) == 0
    after = snapshot(out)
    assert after["notes.txt"] == b"mine"
    assert "train:\n  iterations: 1\n  seed: 2" in after["config.yaml"].decode()
    assert after["actor/model.safetensors"] != before["actor/model.safetensors"]


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys):
    assert main(["train", *TINY, "--out", str(tmp_path / "o"), "--resume", "--overwrite"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_empty_or_foreign_directory_is_used(tmp_path):
    (tmp_path / "data.txt").write_text("x")
    assert main(["train", *TINY, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "data.txt").read_text() == "x" and (tmp_path / "actor").is_dir()


def test_a_refused_plan_leaves_no_run_behind(tmp_path, capsys):
    """A start refused for its plan (dpo generates nothing, so it cannot be disaggregated) writes nothing
    in --out, so the corrected command is not then refused as 'already holds a run'."""
    out = tmp_path / "dpo"
    assert main(["train", "algo=dpo", "--nprocs", "2", "--plan", "disaggregated", "--out", str(out)]) != 0
    assert "disaggregated" in capsys.readouterr().err
    assert not out.exists()


def test_a_run_ends_with_held_out_accuracy(tmp_path, capsys):
    """A run with eval.path ends with a table of its evaluations and first -> last accuracy; the demo
    ends with the held-out accuracy of the warm-up's actor and of the trained one."""
    import json

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in ((1, 2), (3, 4), (2, 5), (4, 4))]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["train", f"data.path={tmp_path / 'p.jsonl'}", f"eval.path={tmp_path / 'p.jsonl'}",
                 "eval.every=1", "train.iterations=2", "data.batch_size=4", "--no-progress",
                 "--out", str(tmp_path / "user")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("eval/accuracy: ") and "at iteration 0 -> " in lines[-1]
    assert lines[-1].endswith("at iteration 1")
    assert lines[-5] == "held-out evaluation (the policy at the start of the iteration):"
    assert main(["train", *TINY, "--out", str(tmp_path / "demo")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("held-out accuracy (20 problems no stage trained on, greedy): ")
    assert last.endswith("after PPO") and "after the SFT warm-up" in last
