"""The runtime's calls on the one-process handle (LocalHandle) equal the algorithm's own calls."""

from __future__ import annotations

import torch

from meshrl.algo import setup
from meshrl.algo.common import CallContext
from meshrl.algo.graph import graph_for
from meshrl.algo.registry import implementation as algo_impl
from meshrl.algo.registry import tensor_keys
from meshrl.algo.trainer import rollout_batch, warmup_sft
from meshrl.config import load_config
from meshrl.runtime.calls import ROW_CALLS, Place, implementation
from meshrl.runtime.handles import LocalHandle


def _roles(cfg, tok):
    torch.manual_seed(cfg.train.seed)
    actor = setup.load_policy(cfg, cfg.train.seed)
    warmup_sft(actor, cfg, tok, lambda _: None, False)
    return setup.build_roles(cfg, actor)


def test_local_handle_calls_match_the_algorithm_calls():
    cfg = load_config(None, ["algo=ppo", "data.batch_size=4", "data.gen_len=4", "sft.steps=20",
                             "sft.batch_size=16", "reward.rule=numeric_distance"])
    tok = setup.tokenizer_for(cfg)
    ours, theirs = _roles(cfg, tok), _roles(cfg, tok)
    prompts = setup.encode_prompt_batch(cfg, tok, setup.prompt_records(cfg))
    ctx = CallContext(cfg, 0, tok)
    a = b = rollout_batch(prompts, cfg, 0)
    for call in graph_for("ppo").calls:
        keys = tensor_keys(call.inputs)
        r = ours[call.role]
        h = LocalHandle(r.model, r.optim, cfg.optim.grad_clip) if r.model is not None else None
        res_b = algo_impl(call, "ppo")(theirs[call.role], b.only(keys), ctx)
        out_b, st_b = res_b if isinstance(res_b, tuple) else (res_b, {})
        if call.name in ROW_CALLS:
            out_a, st_a = implementation(call)(h, a.only(keys).split(1)[0], ctx, Place()), {}
        else:
            out_a, st_a = None, implementation(call)(h, a.only(keys), ctx, Place())
        for k in out_b.keys():
            torch.testing.assert_close(out_a[k], out_b[k], rtol=1e-5, atol=1e-6, msg=f"{call.name}: {k}")
            a = a.with_(**{k: out_a[k]})
            b = b.with_(**{k: out_b[k]})
        assert sorted(st_a) == sorted(st_b)
        for k in st_b:
            assert abs(st_a[k] - st_b[k]) <= 1e-5 * max(abs(st_b[k]), 0.1), (call.name, k, st_a[k], st_b[k])
