"""`meshrl train` end to end on tiny settings: outputs on disk, every algorithm runs, determinism."""


import pytest
import torch

from meshrl.cli import main
from meshrl.config import load_config
from meshrl.observe.metrics import deterministic_part, read_metrics

TINY = ["train.iterations=2", "sft.steps=4", "data.batch_size=8", "sft.batch_size=16"]


def run_cli(tmp_path, *items):
    out = tmp_path / "out"
    assert main(["train", *items, *TINY, "--out", str(out), "--no-progress"]) == 0
    return out


def test_demo_writes_metrics_tensorboard_and_an_hf_checkpoint(tmp_path, capsys):
    out = run_cli(tmp_path)
    printed = capsys.readouterr().out
    assert "sizes: 8 prompts x 1 samples" in printed and f"outputs in {out}/" in printed
    assert "threads: 1 per rank (auto: $OMP_NUM_THREADS)" in printed  # tests/conftest.py sets it to 1
    assert torch.get_num_threads() == 1  # the one rank ran in this process with what it printed
    assert load_config(str(out / "config.yaml")).algo == "ppo"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1]
    for key in ("reward/mean", "kl/k1", "actor/pg_loss", "critic/vf_loss", "time/iteration"):
        assert key in rows[0]
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    # the checkpoint is a real HF one: transformers loads it and agrees with our model
    from transformers import LlamaForCausalLM

    from meshrl.model import load_pretrained

    ours = load_pretrained(out / "actor")
    hf = LlamaForCausalLM.from_pretrained(out / "actor").eval()
    ids = torch.tensor([[257, 55, 43, 53, 61]])
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(ids).logits, atol=1e-4)


@pytest.mark.parametrize("algo", ["grpo", "remax", "rloo", "sft", "rm", "dpo"])
def test_every_algorithm_runs_on_the_demo(tmp_path, algo):
    out = run_cli(tmp_path, f"algo={algo}")
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) == 2 and all("reward/mean" in r for r in rows)
    assert (out / ("reward" if algo == "rm" else "actor") / "config.json").is_file()


def test_same_seed_same_metrics_other_seed_different(tmp_path):
    runs = []
    for i, seed in enumerate((5, 5, 6)):
        out = tmp_path / f"r{i}"
        assert main(["train", "algo=grpo", *TINY, f"train.seed={seed}", "--out", str(out), "--no-progress"]) == 0
        runs.append([deterministic_part(r) for r in read_metrics(out / "metrics.jsonl")])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_bad_input_is_one_clear_error(tmp_path, capsys):
    assert main(["train", "algo=nope", "--out", str(tmp_path)]) == 2
    assert "algo='nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": 1+1}\n')
    assert main(["train", f"data.path={bad}", "--out", str(tmp_path / "o"), *TINY]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
    assert main(["train", "models.reward.path=/does/not/exist", "--out", str(tmp_path / "o")]) == 2
    assert "models.reward.path" in capsys.readouterr().err
