"""Batch split/merge: a property test (hypothesis) over sizes and lengths, plus token balance."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.algo.batch import Batch


def make_batch(lengths: list[int], width: int = 12) -> Batch:
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    ids = torch.arange(len(lengths) * width).view(len(lengths), width)
    return Batch({"input_ids": ids, "attention_mask": mask, "scores": torch.arange(len(lengths)).float()})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=40), st.data())
def test_split_then_merge_is_identity_and_balanced(lengths, data):
    b = make_batch(lengths)
    n = data.draw(st.integers(1, len(lengths)))
    parts = b.split(n)
    assert len(parts) == n and all(len(p) > 0 for p in parts)
    merged = Batch.merge(parts)
    for k in b.keys():
        assert torch.equal(merged[k], b[k])
    loads = [int(p.tokens().sum()) for p in parts]
    # greedy longest-first packing: every part is within one sequence of the lightest part
    assert max(loads) - min(loads) <= max(lengths)
    # micro-batching inside one part also round-trips
    m = data.draw(st.integers(1, len(parts[0])))
    again = Batch.merge([c for c in parts[0].chunks(m)])
    assert torch.equal(again["input_ids"], parts[0]["input_ids"])


def test_split_balances_tokens_not_sequence_counts():
    b = make_batch([12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])  # one long row, twelve short ones
    a, c = b.split(2)
    assert sorted([len(a), len(c)]) == [1, 12]
    assert sorted([int(a.tokens().sum()), int(c.tokens().sum())]) == [12, 12]


def test_select_keys_and_contract_errors():
    b = make_batch([3, 4])
    assert b.only(["scores"]).keys() == ["scores"]
    try:
        b.only(["values"])
    except KeyError as e:
        assert "values" in str(e)
    else:
        raise AssertionError("missing key not reported")
