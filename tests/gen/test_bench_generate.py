"""``meshrl bench generate``: one JSON object with tokens/s, seconds and the completions (the timed
pass after a warm-up), for meshrl's engine and, where installed, vLLM's, which on the same float32
weights give the same greedy completions."""

from __future__ import annotations

import json

import pytest

from meshrl.cli import main
from meshrl.gen.checks import vllm_installed


def bench(capsys, *args: str) -> dict:
    assert main(["bench", "generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i} + {i + 1} ="}) + "\n" for i in range(6)))
    return str(path)


def test_meshrl_backend(capsys, prompts):
    out = bench(capsys, "--model", "tiny", "--prompts", prompts, "--batch-size", "4", "--max-new-tokens", "8",
                "--greedy")
    assert sorted(out) == ["completions", "dtype", "seconds", "tokens_per_s"] and out["dtype"] == "float32"
    assert len(out["completions"]) == 6 and out["seconds"] > 0 and out["tokens_per_s"] > 0


def test_compile_is_meshrl_only(capsys, prompts):
    assert main(["bench", "generate", "--model", "tiny", "--prompts", prompts, "--backend", "vllm", "--compile"]) != 0
    assert "--compile is meshrl's engine's setting" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_vllm_backend_gives_meshrl_completions(capsys, prompts, tmp_path):
    from test_vllm_engine import CFG

    from meshrl.model.checkpoint import build_model, save_pretrained
    from meshrl.model.tokenizer import ByteTokenizer

    ckpt = tmp_path / "ckpt"
    save_pretrained(build_model(CFG, seed=0), ckpt)
    ByteTokenizer().save_pretrained(ckpt)
    args = ["--model", str(ckpt), "--prompts", prompts, "--batch-size", "4", "--max-new-tokens", "12", "--greedy"]
    ours, theirs = bench(capsys, *args), bench(capsys, *args, "--backend", "vllm")
    assert theirs["completions"] == ours["completions"] and theirs["tokens_per_s"] > 0
