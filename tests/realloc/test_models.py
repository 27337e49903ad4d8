"""Reallocation of real ParallelModels on 8 gloo ranks.

- A forward pass after reallocation equals the model built directly in the destination layout, bit
  for bit, and the source model's up to the float32 summation order.
- Train in one layout -> reallocate to a generation layout -> generate -> train again gives the same
  losses, tokens and weights as doing all of it in the home layout.
"""

import functools

import pytest
import torch
import torch.distributed as dist

from meshrl.model.generation import GenerationConfig
from meshrl.parallel.groups import GroupCache
from meshrl.layout.mesh import Placement
from meshrl.parallel.model import ParallelModel
from meshrl.parallel.verify import Probe, rel_diff, token_loss
from meshrl.realloc.executor import Reallocator
from meshrl.realloc.models import refresh, temporary_copy
from meshrl.layout.realloc_plan import realloc_plan
from meshrl.layout.shardmap import shard_map

PROBE = Probe(model="tiny", seed=3, rows=4, seq=10, gen_tokens=5)
_PROC: dict = {}  # this process's GroupCache: groups are made once per process (see groups.py)


def _cache() -> GroupCache:
    return _PROC.setdefault("groups", GroupCache())


def _mover(src: Placement, dst: Placement) -> Reallocator:
    cfg = PROBE.config()
    return Reallocator(realloc_plan(shard_map(cfg, src), shard_map(cfg, dst), 4), dist.get_rank(), 1 << 16)


def _gathered(t: torch.Tensor | None) -> list:
    """Every rank's tensor (or None) on every rank."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, None if t is None else t.tolist())
    return out


def _forward_after_realloc(src_text: str, dst_text: str) -> tuple[bool, float]:
    src, dst = Placement.parse(src_text), Placement.parse(dst_text)
    cfg, cache, initial = PROBE.config(), _cache(), PROBE.build().state_dict()
    batch = PROBE.batch()
    home = ParallelModel.from_state(cfg, src, cache, initial)
    zeros = {n: torch.zeros_like(t) for n, t in initial.items()}
    shadow = ParallelModel.from_state(cfg, dst, cache, zeros)  # proves the realloc writes everything
    direct = ParallelModel.from_state(cfg, dst, cache, initial)
    refresh(_mover(src, dst), home, shadow)
    ids, mask = batch["input_ids"], batch["attention_mask"]  # every replica takes the whole batch
    lp = {k: m.logprobs(ids, mask) if m is not None else None
          for k, m in (("home", home), ("shadow", shadow), ("direct", direct))}
    exact = lp["shadow"] is None or torch.equal(lp["shadow"], lp["direct"])
    homes = [torch.tensor(x) for x in _gathered(lp["home"]) if x is not None]
    close = rel_diff(lp["shadow"], homes[0]) if lp["shadow"] is not None else 0.0
    return exact, close


@pytest.mark.parametrize("src,dst", [
    ("dp2tp2pp1@0-3", "dp4tp1pp1@0-3"),   # equal meshes
    ("dp2tp2pp1@0-3", "dp1tp4pp1@2-5"),   # overlapping, KV heads replicated (tp4 > 2 KV heads)
    ("dp1tp2pp2@0-3", "dp1tp1pp3@7,5,6"),  # disjoint, scattered, pp2 -> pp3 (8 layers)
])
def test_forward_after_reallocation(pool, src, dst):
    res = pool.run(_forward_after_realloc, src, dst)
    assert all(r[0] for r in res), res
    assert max(r[1] for r in res) < 1e-5, res


def _train_gen_train(home_text: str, gen_text: str, via_realloc: bool) -> dict:
    """Two train steps in the home layout with generation in between: in the home layout itself, or
    (via_realloc) on a temporary copy in the generation layout. -> losses, tokens, final weights."""
    home_pl, gen_pl = Placement.parse(home_text), Placement.parse(gen_text)
    cfg, cache, initial = PROBE.config(), _cache(), PROBE.build().state_dict()
    batch = PROBE.batch()
    home = ParallelModel.from_state(cfg, home_pl, cache, initial, optim=PROBE.optim)
    loss_fn = functools.partial(token_loss, n_tokens=float(batch["loss_mask"].sum()))
    out: dict = {"loss": []}
    rows = None
    if home is not None:  # this replica's rows of the batch
        dp, d = home_pl.layout.dp, home_pl.coords_of(dist.get_rank())[0]
        rows = {k: v.tensor_split(dp)[d] for k, v in batch.items()}
        out["loss"].append(home.train_step(rows, loss_fn)["loss"])
    gcfg = GenerationConfig(max_new_tokens=PROBE.gen_tokens, temperature=1.0, pad_token_id=0)
    prompts, seeds = PROBE.prompts(), list(range(100, 100 + PROBE.rows))
    gen = temporary_copy(_mover(home_pl, gen_pl), home, cache) if via_realloc else home
    tokens = gen.generate(prompts, gcfg, seeds).responses if gen is not None else None
    del gen  # the temporary copy is dropped; the home copy and its optimizer state stay
    out["tokens"] = [x for x in _gathered(tokens) if x is not None]
    if home is not None:
        out["loss"].append(home.train_step(rows, loss_fn)["loss"])
        out["params"] = {n: t.clone() for n, t in home.local_state().items()}
    return out


@pytest.mark.parametrize("home,gen", [
    ("dp2tp2pp1@0-3", "dp1tp2pp2@4-7"),   # disjoint (the disaggregated shadow actor)
    ("dp1tp2pp2@0-3", "dp2tp4pp1@0-7"),   # overlapping, larger mesh
])
def test_train_realloc_generate_train_matches_one_layout(pool, home, gen):
    ref = pool.run(_train_gen_train, home, gen, False)
    got = pool.run(_train_gen_train, home, gen, True)
    for r, g in zip(ref, got, strict=True):
        assert r["loss"] == g["loss"]
        assert all(t == r["tokens"][0] for t in r["tokens"] + g["tokens"])
        assert r.keys() == g.keys()
        if "params" in r:
            assert all(torch.equal(r["params"][n], g["params"][n]) for n in r["params"])
