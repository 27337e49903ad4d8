"""The router load-balancing loss (ppo.moe_aux_coef) against transformers' load_balancing_loss_func,
and its independence from the micro-batch split."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from meshrl.algo.handles import LocalHandle
from meshrl.model import load_pretrained

from model_hf_util import hf_family_model  # tests/model is on sys.path

COEF = 0.5


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, vocab, (4, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, -4:] = 0  # right padding
    return {"input_ids": ids, "attention_mask": mask}


def _zero_loss(out, mb):
    return 0.0 * out.logprobs.sum()  # only the balance loss has a gradient


def _ours(path, batch, micro: int) -> dict[str, torch.Tensor]:
    model = load_pretrained(path)
    LocalHandle(model).forward_backward(batch, _zero_loss, micro, moe_aux=COEF / len(batch["input_ids"]))
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family,extra", [("qwen3_moe", dict(num_hidden_layers=3, decoder_sparse_step=1,
                                                              mlp_only_layers=[1])),
                                          ("mixtral", dict(sliding_window=None))])
def test_balance_loss_gradient_matches_transformers_per_row(tmp_path, family, extra):
    """Oracle: transformers' own function on one row and one layer at a time (its formula for a
    batch of one sequence), averaged over rows and MoE layers, times the coefficient."""
    ref = hf_family_model(family, **extra)
    ref.save_pretrained(tmp_path)
    batch = _batch(ref.config.vocab_size)
    ref.train()
    out = ref(**batch, output_router_logits=True)
    ids = batch["input_ids"]
    b, s = ids.shape
    terms = []
    for logits in out.router_logits:  # one [B*S, E] per MoE layer
        per_row = logits.view(b, s, -1)
        for r in range(b):
            terms.append(load_balancing_loss_func((per_row[r],), logits.shape[-1], ref.config.num_experts_per_tok,
                                                  batch["attention_mask"][r:r + 1]))
    assert len(out.router_logits) == 2  # Qwen3-MoE: layer 1 is dense (mlp_only_layers)
    (COEF * torch.stack(terms).mean()).backward()
    # transformers 5 names Mixtral's block ``mlp`` in memory (``block_sparse_moe`` on disk, as ours)
    rename = (lambda n: n.replace(".mlp.", ".block_sparse_moe.")) if family == "mixtral" else (lambda n: n)
    want = {rename(n): p.grad for n, p in ref.named_parameters() if p.grad is not None}
    got = _ours(tmp_path, batch, micro=1)
    routers = [n for n in want if n.endswith("gate.weight") and "experts" not in n]
    assert routers and all(want[n].abs().max() > 0 for n in routers)
    for name in routers + ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]:
        rel = ((got[name] - want[name]).abs().max() / want[name].abs().max()).item()
        assert rel <= 1e-4, (name, rel)


def test_balance_loss_is_independent_of_the_micro_batch_split(tmp_path):
    ref = hf_family_model("qwen3_moe")
    ref.save_pretrained(tmp_path)
    batch = _batch(ref.config.vocab_size)
    one, four = _ours(tmp_path, batch, micro=1), _ours(tmp_path, batch, micro=4)
    assert one.keys() == four.keys()
    for name in one:
        scale = one[name].abs().max().clamp_min(1e-30)
        assert ((one[name] - four[name]).abs().max() / scale).item() <= 1e-5, name  # summation order only
    assert one["model.layers.0.mlp.gate.weight"].abs().max() > 0
