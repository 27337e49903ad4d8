"""`--resume` whenever a job was killed (issue 18, item 3): before its first checkpoint the same
command + --resume starts over and says so, and ends as the uninterrupted job; a resume that
would configure another run is refused."""

import os
import subprocess
import sys

from safetensors.torch import load_file

from meshrl.cli import main

ARGS = ["data.batch_size=4", "data.gen_len=4", "sft.steps=2", "sft.batch_size=8", "train.iterations=2",
        "--nprocs", "1", "--no-progress"]


def test_killed_before_the_first_checkpoint_resume_starts_over(tmp_path, capsys):
    assert main(["train", *ARGS, "--out", str(tmp_path / "a")]) == 0
    out = tmp_path / "b"
    # the rank dies at its first generation (before any checkpoint); a one-rank run may be this very
    # process, so the killed job runs in its own
    env = {**os.environ, "MESHRL_FAULT": "0:actor_gen"}
    killed = subprocess.run([sys.executable, "-m", "meshrl.cli", "train", *ARGS, "--out", str(out)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0
    assert (out / "config.yaml").is_file() and not list(out.glob("ckpt-*"))
    capsys.readouterr()
    assert main(["train", *ARGS, "--out", str(out)]) == 2  # the run is there: not silently replaced
    assert "--resume" in capsys.readouterr().err
    assert main(["train", *ARGS, "--out", str(out), "--resume"]) == 0
    assert "no checkpoint in" in capsys.readouterr().out
    want, got = load_file(tmp_path / "a/actor/model.safetensors"), load_file(out / "actor/model.safetensors")
    assert sorted(got) == sorted(want) and all((got[k] == want[k]).all() for k in want)


def test_resume_into_an_empty_directory_starts_from_the_beginning(tmp_path, capsys):
    assert main(["train", *ARGS, "--out", str(tmp_path / "new"), "--resume"]) == 0
    assert "starts from the beginning" in capsys.readouterr().out
    assert (tmp_path / "new" / "actor" / "model.safetensors").is_file()


def test_resume_with_another_config_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *ARGS, "--out", str(out)]) == 0
    before = (out / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["train", *ARGS, "optim.lr=0.5", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "optim.lr: 0.001 in the run, 0.5 now" in err and "Traceback" not in err
    assert (out / "metrics.jsonl").read_bytes() == before


def test_ctrl_c_ends_the_run_naming_its_newest_checkpoint_and_how_to_go_on(tmp_path):
    """SIGINT (Ctrl-C) after the first checkpoint: exit 130, no traceback, and the last line names
    the checkpoint kept and --resume (which the tests above and tests/runtime/test_job.py check)."""
    import signal
    import time

    out = tmp_path / "run"
    args = [a for a in ARGS if a != "train.iterations=2"] + ["train.iterations=400", "train.save_every=1"]
    job = subprocess.Popen([sys.executable, "-m", "meshrl.cli", "train", *args, "--out", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not list(out.glob("ckpt-*/meta.json")) and job.poll() is None and time.time() - t0 < 300:
        time.sleep(0.05)
    job.send_signal(signal.SIGINT)
    try:
        _, err = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # a second Ctrl-C, as a user presses it when the first did not end the run
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=120)
    assert job.returncode == 130, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"meshrl train: interrupted; {out}/ keeps ckpt-"), err
    assert "--resume continues from it" in line and "Traceback" not in err


def test_a_ctrl_c_that_python_drops_still_stops_the_run_at_the_next_step():
    """A KeyboardInterrupt raised in a finalizer is printed as "Exception ignored" and lost; the
    press is recorded (meshrl/interrupt.py) and the engine's step loop raises it."""
    import gc
    import os
    import signal

    from meshrl import interrupt

    class Finalized:
        def __del__(self):  # SIGINT handled here: Python drops the KeyboardInterrupt it raises
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # the handler runs at a bytecode boundary inside __del__

    previous = interrupt.install()
    try:
        Finalized()
        gc.collect()
        try:
            interrupt.check()
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the recorded Ctrl-C was not raised")
    finally:
        interrupt.restore(previous)
        interrupt._pressed.clear()
