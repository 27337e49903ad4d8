"""The demo learns in bf16 (``train.dtype=bfloat16``: bf16 weights, activations and gradients, fp32
master weights and AdamW moments, fp32 log-probs and losses), on the CPU: the SFT stage in bf16
(its checkpoint is written in bf16), then GRPO in bf16 from it raises reward/mean.

Same measure as tests/algo/test_learning.py: the mean reward/mean of the last K = 10 iterations
minus that of the first 10, whose noise std is about 0.022 for GRPO (32 prompts x 4 samples).
MARGIN is below the smallest rise measured over seeds 1, 2, 3 (see below) and about 3.5 noise stds.
"""

from safetensors import safe_open

from meshrl.cli import main
from meshrl.observe.metrics import read_metrics

SFT_STEPS, ITERS, K = 150, 40, 10
# Rises measured with these two commands for train.seed = 1, 2, 3 (SFT and GRPO with the same
# seed; commit f46fd01): 0.117, 0.198, 0.251 (fp32, tests/algo/test_learning.py: 0.202, 0.177, 0.249).
MARGIN = 0.08
BF16 = "train.dtype=bfloat16"


def test_grpo_learns_in_bf16(tmp_path):
    sft = tmp_path / "sft"
    assert main(["train", "algo=sft", f"train.iterations={SFT_STEPS}", "data.batch_size=64", BF16,
                 "--out", str(sft), "--no-progress"]) == 0
    with safe_open(sft / "actor" / "model.safetensors", framework="pt") as f:
        dtypes = {str(f.get_slice(n).get_dtype()) for n in f.keys()}
    assert dtypes == {"BF16"}, dtypes  # it trained in bf16
    rl = tmp_path / "rl"
    assert main(["train", f"models.actor.path={sft / 'actor'}", "algo=grpo", "data.batch_size=32",
                 f"train.iterations={ITERS}", "train.seed=1", BF16, "--out", str(rl), "--no-progress"]) == 0
    r = [m["reward/mean"] for m in read_metrics(rl / "metrics.jsonl")]
    gain = sum(r[-K:]) / K - sum(r[:K]) / K
    assert gain > MARGIN, r
