"""A tensor-parallel stage builds only its own experts (Backbone's ``experts``), named by global id."""

import torch

from meshrl.model.config import ModelConfig
from meshrl.model.transformer import Backbone

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=16, norm_topk_prob=True)


def test_backbone_builds_only_the_experts_asked_for():
    with torch.device("meta"):
        whole, part = Backbone(CFG), Backbone(CFG, experts=range(2, 4))
    for a, b in zip(whole.layers, part.layers, strict=True):
        if a.moe:
            assert len(a.ffn.experts) == 4 and a.ffn.experts.first == 0
            assert len(b.ffn.experts) == 2 and b.ffn.experts.first == 2
    assert sum(p.numel() for p in part.parameters()) < sum(p.numel() for p in whole.parameters())
