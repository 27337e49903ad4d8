"""The RL runtime's rollouts hold no copy of the weights between calls (their weights change every
step; the planner prices the copies as held during the call only), while a plain generate keeps them."""

from __future__ import annotations

from meshrl.algo.rollout import generation_config
from meshrl.config import load_config
from meshrl.model import ByteTokenizer, GenerationConfig


def test_rollouts_keep_no_weights_between_calls():
    cfg = load_config(None, [])
    assert not generation_config(cfg, ByteTokenizer()).keep_weights
    assert not generation_config(cfg, ByteTokenizer(), greedy=True).keep_weights
    assert GenerationConfig().keep_weights
