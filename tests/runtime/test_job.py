"""`meshrl train --nprocs N`: a rank that crashes or hangs (alive, never answering) ends the whole
job within a bounded time (the other ranks' waits end at ``train.timeout``), named, with nothing
left behind; a job killed with SIGKILL at a random moment and resumed ends with the uninterrupted
run's weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from meshrl.runtime.checkpoint import ShardReader

ARGS = ["algo=ppo", "data.batch_size=4", "data.gen_len=4", "sft.steps=2", "sft.batch_size=8",
        "train.iterations=3", "train.save_every=1", "--nprocs", "2", "--plan", "disaggregated", "--no-progress"]


def _tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (the job and every rank it started)."""
    out = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if tag.encode() in env.read_bytes():
                out.append(int(env.parent.name))
        except OSError:
            continue
    return out


def _start(out: Path, extra: list[str], env: dict[str, str], plan: str = "disaggregated") -> subprocess.Popen:
    args = [plan if a == "disaggregated" else a for a in ARGS]
    return subprocess.Popen([sys.executable, "-m", "meshrl.cli", "train", *args, *extra, "--out", str(out)],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@pytest.mark.parametrize("fault, extra, how", [
    ("1:actor_gen", [], "killed"),  # the rank's process exits at once
    ("1:actor_gen:hang", ["train.timeout=10"], "hung"),  # alive, never answering: the others' waits time out
])
def test_a_failing_rank_ends_the_job_naming_rank_and_step(tmp_path, fault, extra, how):
    tag = f"MESHRL_TEST_{uuid.uuid4().hex}"
    proc = _start(tmp_path / "run", extra, {"MESHRL_FAULT": fault, tag: "1"})
    text, _ = proc.communicate(timeout=300)
    ended = time.time()
    assert proc.returncode == 1, text
    assert "the job failed and was stopped" in text, text
    assert f"rank1: step 'actor_gen' of iteration 0 ({how} by MESHRL_FAULT" in text, text
    status = (tmp_path / "run" / ".ranks" / "rank1").read_text()
    failed = float(status.rsplit("at ", 1)[1].rstrip(")"))
    assert ended - failed < 60, f"the job took {ended - failed:.0f} s to end after rank 1 {how}"
    time.sleep(1.0)
    assert _tagged_pids(tag) == [], "processes of the job are still alive"


def _final_params(out: Path) -> dict[str, torch.Tensor]:
    ck = sorted(out.glob("ckpt-*"))[-1]
    assert json.loads((ck / "meta.json").read_text())["iteration"] == 2
    reader = ShardReader(ck)  # every tensor of the state (weights and AdamW moments), whole
    return {k: reader.full(k) for k in reader.index["tensors"]}


@pytest.mark.parametrize("mode", ["sync", "async", "async2", "stream2"])
@pytest.mark.parametrize("trial", range(int(os.environ.get("MESHRL_RESUME_TRIALS", "2"))))
def test_sigkill_then_resume_ends_with_the_uninterrupted_weights(tmp_path_factory, trial, mode):
    """``async`` (train.off_policy=1): the checkpoint after iteration t also holds the batch of t+1
    generated during t (from weights one update old); resume must use it, not generate it again.
    ``async2`` (train.off_policy=2): it holds the batches of t+1 and t+2. ``stream2`` (and
    train.stream_steps=2, partial rollouts): batch t+1 finished, t+2 half-generated (its sequences
    in flight, with their tokens' versions), continued after the resume."""
    base = tmp_path_factory.getbasetemp()
    plan = "disaggregated"
    cfg = {"sync": [], "async": ["train.off_policy=1"], "async2": ["train.off_policy=2", "train.stream_steps=0"],
           "stream2": ["train.off_policy=2", "train.stream_steps=2"]}[mode]
    ref_dir = base / f"uninterrupted-{mode}"
    if not ref_dir.exists():
        proc = _start(ref_dir, cfg, {}, plan)
        assert proc.wait(timeout=600) == 0, proc.stdout.read()
    want = _final_params(ref_dir)
    out = tmp_path_factory.mktemp(f"killed-{mode}{trial}")
    tag = f"MESHRL_TEST_{uuid.uuid4().hex}"
    proc = _start(out, cfg, {tag: "1"}, plan)
    # Every fifth trial is killed at a random moment of start-up (no checkpoint yet: start again);
    # the others at a random moment of what follows the first checkpoint: iterations 1 and 2 as long
    # as the uninterrupted run's (mid-iteration, mid-save; async: with a batch generated ahead) and
    # one second more (the last save, export, exit). Iterations last ~0.5 s here.
    rng, t0 = random.Random(trial), time.time()
    if trial % 5 == 0:
        delay = rng.uniform(2.0, 20.0)
    else:
        while not (out / "ckpt-000000").exists() and proc.poll() is None and time.time() - t0 < 300:
            time.sleep(0.01)
        rest = sum(r["time/iteration"] for r in _records(ref_dir) if r["iteration"] > 0) + 1.0
        delay = time.time() - t0 + rng.uniform(0.0, rest)
    try:
        proc.wait(timeout=max(0.0, delay - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job: launcher and ranks, at once
        proc.wait()
    time.sleep(1.0)
    assert _tagged_pids(tag) == []
    done = sorted(p for p in os.listdir(out) if p.startswith("ckpt-")) if out.exists() else []
    meta = json.loads((out / done[-1] / "meta.json").read_text()) if done else {}
    print(f"{mode} trial {trial}: SIGKILL after {delay:.1f} s; newest checkpoint: {done[-1] if done else 'none'}"
          f"{' (with iterations %s generated ahead)' % meta['ahead'] if meta.get('ahead') else ''}")
    proc = _start(out, cfg + ["--resume"], {}, plan)  # the same command + --resume, whenever it was killed
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text
    assert ("starts from the beginning" in text) == (not done), text
    got = _final_params(out)
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want), f"{mode} trial {trial} (killed after {delay:.1f} s)"
    assert [r["iteration"] for r in _records(out)] == [0, 1, 2]


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_torchrun_node_groups_on_localhost(tmp_path):
    """The same entry point under torchrun: two 'nodes' of one rank each, env:// rendezvous."""
    port = str(29500 + random.Random(str(tmp_path)).randrange(400))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--master-addr", "127.0.0.1", "--master-port", port]
    train = ["-m", "meshrl.cli", "train", *ARGS[:6], "train.iterations=2", "--plan", "disaggregated",
             "--no-progress", "--out", str(tmp_path / "run")]
    procs = [subprocess.Popen(cmd + ["--node-rank", str(n)] + train, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for n in (1, 0)]
    try:
        texts = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], texts
    assert "plan: disaggregated on 2 ranks" in texts[1] and "plan:" not in texts[0]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [0, 1]
    assert (tmp_path / "run" / "actor" / "model.safetensors").is_file()


@pytest.mark.parametrize("plan, message", [
    ("nope", "unknown strategy 'nope'"),
    ("missing.json", "plan file not found: missing.json"),
    ("WRONG_WORLD", "is for 4 devices, but this run has 2 ranks"),
])
def test_bad_plans_are_refused_before_any_rank_starts(tmp_path, plan, message):
    if plan == "WRONG_WORLD":
        from meshrl.layout.mesh import Layout, Mesh
        from meshrl.plan.execution_plan import CallPlan, Cluster, ExecutionPlan

        names = ["actor_gen", "reward_inf", "ref_inf", "critic_inf", "actor_train", "critic_train"]
        plan = str(tmp_path / "p.json")
        Path(plan).write_text(ExecutionPlan(Cluster(1, 4), {n: CallPlan(Mesh.range(0, 4), Layout(4)) for n in names})
                              .to_json())
    args = [a if a != "disaggregated" else plan for a in ARGS]
    res = subprocess.run([sys.executable, "-m", "meshrl.cli", "train", *args, "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "meshrl train: error:" in res.stderr and message in res.stderr, res.stderr
    assert not (tmp_path / "o" / ".ranks").exists()


@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_failed_run_with_its_progress_bar_prints_the_failure_on_a_line_of_its_own(tmp_path, nprocs):
    """The progress bar (in rank 0's process: this one, or a rank killed after another's failure)
    ends before the failure is printed, and a killed rank leaves no semaphore (tqdm's lock) that
    multiprocessing's resource tracker would report as leaked."""
    rewards = tmp_path / "rewards.py"
    rewards.write_text("def boom(prompt, response, answer, **row):\n    raise ValueError('no way')\n")
    args = ["algo=grpo", "data.batch_size=4", "data.gen_len=4", "sft.steps=2", "sft.batch_size=8",
            "train.iterations=2", f"reward.fn={rewards}:boom", "--nprocs", str(nprocs)]
    proc = subprocess.run([sys.executable, "-m", "meshrl.cli", "train", *args, "--out", str(tmp_path / "run")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
    lines = proc.stdout.replace("\r", "\n").splitlines()
    assert any(line.startswith("meshrl train: the job failed and was stopped: ") for line in lines), proc.stdout
    assert "raised ValueError: no way" in proc.stdout, proc.stdout
    assert "leaked" not in proc.stdout, proc.stdout
