"""CUDA-only checks (skipped without a GPU; bench/gpu.sh runs them on one): the runtime trains in
bf16 on cuda:0 under NCCL with the strict communication mode on, the data plane refuses a CPU
tensor there, streamed partial rollouts run there, and the train step's measured peak memory is
what the planner predicts."""

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


def test_streamed_partial_rollouts_on_one_gpu(tmp_path):
    """train.stream_steps on cuda:0: the rows in flight are host data, the engine's outputs the
    device's; sequences are interrupted and every token's version is logged."""
    out = subprocess.run([sys.executable, "-m", "meshrl.cli", "train", "--nprocs", "1", "--out", str(tmp_path),
                          "train.iterations=4", "train.dtype=bfloat16", "sft.steps=20", "train.off_policy=2",
                          "train.stream_steps=1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert recs[3]["rollout/interrupted"] > 0 and 1.0 < recs[3]["rollout/staleness_mean"] < 2.0


def test_step_memory_is_predicted_within_15_percent():
    out = subprocess.run([sys.executable, "bench/gpu_step.py", "--preset", "qwen2.5-0.5b", "--batch", "4",
                          "--seq", "512", "--steps", "2", "--skip-generation"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    train = json.loads(out.stdout)["train"]
    assert abs(train["mem_error"]) <= 0.15, train


def test_flash_attention_applies_to_batches_without_left_padding():
    """With only the flash kernel allowed, a right-padded bf16 batch runs (no mask reaches SDPA);
    a left-padded one needs the mask, which flash cannot take."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from meshrl.model.checkpoint import build_model
    from meshrl.model.presets import get_preset

    cfg = get_preset("tiny").replace(num_key_value_heads=8)  # no GQA: the plainest flash case
    model = build_model(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(1, 250, (4, 64), device="cuda")
    right = torch.ones_like(ids)
    right[1, 40:] = 0
    with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        assert torch.isfinite(model(ids, right)[right.bool()]).all()
        left = right.flip(1)
        with pytest.raises(RuntimeError):
            model(ids, left)


def test_zero_adamw_is_fused_on_cuda():
    from torch import nn

    from meshrl.parallel.data import AdamWConfig, ZeroAdamW
    from meshrl.parallel.groups import Axis

    p = nn.Parameter(torch.randn(64, 32, device="cuda", dtype=torch.bfloat16))
    opt = ZeroAdamW([p], Axis((0,), 0, None), AdamWConfig(lr=1e-3))
    p.grad = torch.randn_like(p)
    before = p.detach().clone()
    opt.step()
    assert opt.impl == "fused" and not torch.equal(p, before)
