"""DAPO's group filter and evaluation during training, against cases computed by hand or by an
independent greedy decoder."""

from __future__ import annotations

import json

import pytest
import torch

from meshrl.algo.batch import Batch
from meshrl.algo.evaluate import eval_metrics, evaluate_local
from meshrl.algo.filtering import group_rows
from meshrl.algo.handles import LocalHandle
from meshrl.commands.settings import load_settings
from meshrl.model.checkpoint import build_model
from meshrl.model.tokenizer import ByteTokenizer


def test_filter_keeps_informative_groups_then_fills_in_draw_order():
    # 4 groups of 2: [1, 1] equal, [0, 1] varied, [1, 1] equal, [0.5, 0] varied
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0])
    rows, kept = group_rows(scores, 2, 2)
    assert rows.tolist() == [2, 3, 6, 7] and kept == 2
    rows, kept = group_rows(scores, 2, 3)  # only 2 informative: group 0 (first equal one) fills the batch
    assert rows.tolist() == [0, 1, 2, 3, 6, 7] and kept == 2
    rows, kept = group_rows(torch.ones(6), 3, 1)  # nothing informative: the first group, advantage 0
    assert rows.tolist() == [0, 1, 2] and kept == 0


def test_eval_metrics_by_hand():
    cfg = load_settings(None, ["eval.samples=3", "eval.correct=1.0"])
    rows = Batch({"rewards": torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.0]), "row_id": torch.tensor([0, 0, 0, 1, 1, 1])})
    got = eval_metrics(rows, cfg)
    assert got == pytest.approx({"eval/reward": 1.5 / 6, "eval/accuracy": 1 / 6, "eval/pass@3": 0.5})


def _greedy(model, prompt: list[int], n: int, eos: int) -> list[int]:
    """Independent greedy decoding: the full forward each step, argmax, stop at EOS."""
    ids = list(prompt)
    out = []
    for _ in range(n):
        with torch.no_grad():
            nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
        if nxt == eos:
            break
        out.append(nxt)
        ids.append(nxt)
    return out


def test_greedy_eval_matches_an_independent_decoder(tmp_path):
    """eval.samples=1 with a user reward that tells texts apart (sum of code points mod 7, / 7) and
    eval.correct=0.7: reward and accuracy are those of the greedy responses decoded independently."""
    (tmp_path / "r.py").write_text("def code(prompt, response, answer, **row):\n"
                                   "    return sum(map(ord, response)) % 7 / 7\n")
    prompts = ["1+2=", "3+4=", "9+9=", "0+5=", "7+1="]
    (tmp_path / "e.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts))
    cfg = load_settings(None, [f"eval.path={tmp_path / 'e.jsonl'}", f"reward.fn={tmp_path / 'r.py'}:code",
                             "eval.correct=0.7", "data.gen_len=5"])
    tok = ByteTokenizer()
    model = build_model("tiny", seed=4).eval()
    got = evaluate_local(LocalHandle(model), cfg, tok, 0)
    texts = [tok.decode(_greedy(model, [tok.bos_token_id, *tok.encode(p)], 5, tok.eos_token_id)) for p in prompts]
    rewards = [sum(map(ord, t)) % 7 / 7 for t in texts]
    assert 0 < sum(r >= 0.7 for r in rewards) < len(prompts), rewards  # a case that tells right from wrong
    assert got["eval/reward"] == pytest.approx(sum(rewards) / len(prompts), rel=1e-6)
    assert got["eval/accuracy"] == pytest.approx(sum(r >= 0.7 for r in rewards) / len(prompts))
