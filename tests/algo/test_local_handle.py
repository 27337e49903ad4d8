"""The one-process handle (LocalHandle) runs the model on the columns that hold a real token only;
its outputs equal the plain model's on the full padded batch, and its gradient a plain backward's."""

from __future__ import annotations

import copy

import torch

from meshrl.model import build_model
from meshrl.algo.handles import LocalHandle


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows with two all-pad columns on the left and three on the right, [3, 12]."""
    ids = torch.tensor([[256, 256, 256, 257, 51, 43, 52, 61, 55, 258, 256, 256],
                        [256, 256, 257, 50, 43, 50, 61, 52, 258, 256, 256, 256],
                        [256, 256, 256, 257, 53, 43, 49, 61, 52, 256, 256, 256]])
    return ids, (ids != 256).long()


def test_logprobs_values_and_entropy_equal_the_untrimmed_model_on_real_tokens():
    ids, attn = _padded_batch()
    model = build_model("tiny", seed=1)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids, attn).float(), -1)
    want = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)  # [3, 11]
    want_ent = -(logp.exp() * logp).sum(-1)[:, :-1]
    got, ent = LocalHandle(model).logprobs(ids, attn, entropy=True)
    real = attn[:, 1:].bool() & attn[:, :-1].bool()  # a real token predicted from a real prefix
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[real], want_ent[real], rtol=1e-5, atol=1e-5)
    assert got.shape == (3, 11) and (got[:, :1] == 0).all() and (got[:, -2:] == 0).all()
    critic = build_model("tiny", seed=2, value_head=True)
    with torch.no_grad():
        v_want = critic(ids, attn).float()
    v = LocalHandle(critic).values(ids, attn)
    assert v.shape == (3, 12)
    torch.testing.assert_close(v[attn.bool()], v_want[attn.bool()], rtol=1e-5, atol=1e-5)


def test_forward_backward_and_step_equal_a_plain_update():
    ids, attn = _padded_batch()
    model = build_model("tiny", seed=3)
    plain = copy.deepcopy(model)
    real = attn[:, 1:] * attn[:, :-1]  # a real token predicted from a real prefix
    mask = real.float()

    def loss_fn(out, mb):  # a masked NLL normalised by the whole batch's tokens (additive over micro-batches)
        m = mb["attention_mask"]
        return -(out.logprobs * m[:, 1:] * m[:, :-1]).sum() / mask.sum()

    h = LocalHandle(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_clip=1.0)
    total = h.forward_backward({"input_ids": ids, "attention_mask": attn}, loss_fn, micro_batches=2)
    norm = h.optimizer_step()
    logp = torch.log_softmax(plain(ids, attn).float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -(logp * mask).sum() / mask.sum()
    loss.backward()
    want_norm = float(torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0))
    torch.optim.SGD(plain.parameters(), lr=0.1).step()
    assert abs(total - float(loss.detach())) < 1e-5 and abs(norm - want_norm) < 1e-4 * want_norm
    for (name, a), b in zip(model.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert all(p.grad is None for p in model.parameters())
