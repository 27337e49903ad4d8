"""The executor on 8 real gloo ranks: every destination shard equals the slice of the full tensor,
bit for bit, for equal, overlapping and disjoint meshes and TP/PP changes that are not divisors;
the bytes each rank moves add up to the plan's count."""

import os
import zlib

import pytest
import torch
import torch.distributed as dist

from meshrl.model.config import ModelConfig, param_shapes
from meshrl.model.presets import get_preset
from meshrl.layout.mesh import Placement
from meshrl.realloc.bench import move_and_check
from meshrl.realloc.executor import Reallocator
from meshrl.layout.realloc_plan import realloc_plan
from meshrl.layout.shardmap import shard_map
from meshrl.realloc.synthetic import cut_shards, synthetic

TINY = get_preset("tiny")
MOE = get_preset("tiny-moe").replace(mlp_only_layers=(1, 4))  # dense layers between sparse ones
MIXTRAL = MOE.replace(model_type="mixtral", mlp_only_layers=(), intermediate_size=64)
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
# 6 heads and 5 layers: tp3 <-> tp2 and pp3 <-> pp2 do not divide each other; biases, tied head.
SIX = ModelConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=5,
                  num_attention_heads=6, num_key_value_heads=6, attention_bias=True,
                  tie_word_embeddings=True, model_type="qwen2")


def _full(cfg: ModelConfig, value_head: bool, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in param_shapes(cfg, value_head).items()}


def _move_full(cfg, src, dst, value_head=False, bucket_bytes=1 << 20, seed=0):
    """On every rank: cut source shards from full random tensors, move, compare with the full tensors."""
    rank = dist.get_rank()
    plan = realloc_plan(shard_map(cfg, Placement.parse(src), value_head),
                        shard_map(cfg, Placement.parse(dst), value_head), dtype_bytes=4)
    full = _full(cfg, value_head, seed)
    mover = Reallocator(plan, rank, bucket_bytes)
    out, stats = mover.run(cut_shards(full, plan.src, rank), dtype=torch.float32)
    want = cut_shards(full, plan.dst, rank)
    exact = set(out) == set(want) and all(torch.equal(out[n], want[n]) for n in want)
    return exact, stats.sent, stats.received, len(out)


CASES = [
    # (model, source, destination, value head, bucket bytes)
    (TINY, "dp2tp2pp1@0-3", "dp1tp4pp1@0-3", False, 1 << 20),     # equal mesh, 4 ranks
    (TINY, "dp2tp2pp1@0-3", "dp1tp2pp2@2-5", False, 1 << 20),     # overlapping
    (TINY, "dp2tp2pp1@0-3", "dp4tp1pp1@4-7", False, 1 << 20),     # disjoint
    (TINY, "dp2tp2pp2@0-7", "dp1tp8pp1@0-7", False, 4096),        # 8 ranks, KV heads replicated, many rounds
    (TINY, "dp1tp8pp1@0-7", "dp2tp1pp4@0-7", False, 1 << 20),     # from replicated KV heads
    (TINY, "dp1tp2pp2@0,2,4,6", "dp2tp2pp1@7,5,3,1", False, 1 << 20),  # scattered, reversed meshes
    (SIX, "dp1tp3pp1@0-2", "dp1tp2pp2@3-6", False, 1 << 20),      # tp3 -> tp2, disjoint
    (SIX, "dp2tp3pp1@0-5", "dp1tp2pp3@2-7", False, 1000),         # tp3 -> tp2, pp1 -> pp3 (5 layers)
    (SIX, "dp1tp2pp2@0-3", "dp1tp6pp1@2-7", True, 1 << 20),       # value head, tp2 -> tp6
    # Qwen3-MoE (8 experts a layer, whole over tp) and Mixtral's names, q/k norms replicated
    (MOE, "dp1tp8pp1@0-7", "dp2tp2pp2@0-7", False, 4096),         # 1 expert a rank -> 4, pp2
    (MIXTRAL, "dp2tp4pp1@0-7", "dp1tp2pp2@1,3,5,7", True, 1 << 20),  # value head
]


@pytest.mark.parametrize("cfg,src,dst,value_head,bucket", CASES, ids=[f"{c[1]}->{c[2]}" for c in CASES])
def test_destination_equals_source_bit_for_bit(pool, cfg, src, dst, value_head, bucket):
    res = pool.run(_move_full, cfg, src, dst, value_head, bucket)
    assert all(r[0] for r in res), [r[0] for r in res]
    plan = realloc_plan(shard_map(cfg, Placement.parse(src), value_head),
                        shard_map(cfg, Placement.parse(dst), value_head), dtype_bytes=4)
    assert sum(r[1] for r in res) == sum(r[2] for r in res) == plan.bytes
    for rank, r in enumerate(res):  # ranks outside the destination mesh get nothing
        assert (r[3] > 0) == (rank in Placement.parse(dst).mesh)


def _refresh_in_place(src, dst):
    """A long-lived shadow copy refreshed twice in place: same tensors, new values."""
    rank = dist.get_rank()
    plan = realloc_plan(shard_map(TINY, Placement.parse(src)), shard_map(TINY, Placement.parse(dst)), 4)
    mover = Reallocator(plan, rank)
    full = _full(TINY, False, 1)
    shadow, _ = mover.run(cut_shards(full, plan.src, rank), dtype=torch.float32)
    ptrs = {n: t.data_ptr() for n, t in shadow.items()}
    full = {n: t * 2 + 1 for n, t in full.items()}  # "an optimizer step"
    again, _ = mover.run(cut_shards(full, plan.src, rank), out=shadow, dtype=torch.float32)
    want = cut_shards(full, plan.dst, rank)
    same = again is shadow and all(t.data_ptr() == ptrs[n] for n, t in shadow.items())
    return same and all(torch.equal(shadow[n], want[n]) for n in want)


def test_shadow_refresh_in_place(pool):
    assert all(pool.run(_refresh_in_place, "dp2tp2pp1@0-3", "dp1tp2pp2@4-7"))


def test_synthetic_bench_path_in_bf16(pool):
    res = pool.run(move_and_check, TINY, "dp2tp1pp2@0-3", "dp1tp4pp1@4-7", dtype="bf16", repeat=2)
    assert all(r["exact"] for r in res)
    plan = realloc_plan(shard_map(TINY, Placement.parse("dp2tp1pp2@0-3")),
                        shard_map(TINY, Placement.parse("dp1tp4pp1@4-7")), 2)
    assert sum(r["sent"] for r in res) == plan.bytes


def _wrong_shapes():
    rank = dist.get_rank()
    plan = realloc_plan(shard_map(TINY, Placement.parse("dp1tp2pp1@0-1")),
                        shard_map(TINY, Placement.parse("dp2tp1pp1@0-1")), 4)
    src = cut_shards(_full(TINY, False, 0), plan.dst, rank)  # the wrong layout's shards
    try:
        Reallocator(plan, rank).run(src)
    except ValueError as e:
        return str(e)
    return ""


def test_wrong_source_shards_are_refused_before_any_message(pool):
    msgs = pool.run(_wrong_shapes)
    assert "source shard model.embed_tokens.weight is (264, 128)" in msgs[0]
    assert msgs[2] == ""  # not in either mesh: nothing to check, nothing to do


def _huge_page_flag() -> bool:
    """Whether the mapping that holds a new 8 MiB tensor was madvised for huge pages ('hg')."""
    t = torch.empty(8 << 20, dtype=torch.uint8)  # kept alive: freeing it unmaps it
    p, inside = t.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: "lo-hi perms ..."
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= p < hi
            elif head == "VmFlags:" and inside:
                return "hg" in line.split()[1:]
    return False


@pytest.mark.skipif(not os.path.exists(THP) or "[never]" in open(THP).read(), reason="no transparent huge pages")
def test_rank_processes_follow_the_users_huge_page_setting(pool):
    """Rank processes ask for huge pages exactly when the user set THP_MEM_ALLOC_ENABLE=1 (PyTorch's
    default, off, is meshrl's: huge pages made fresh copies slower here, docs/realloc.md)."""
    want = os.environ.get("THP_MEM_ALLOC_ENABLE", "0") == "1"
    assert pool.run(_huge_page_flag) == [want] * 8


def test_synthetic_weights_follow_their_formula():
    """The in-place tensor hash equals the formula computed on Python integers, element by element."""
    name, shape, region, seed = "model.layers.0.mlp.up_proj.weight", (7, 300), ((2, 5), (17, 290)), 3
    salt, m46 = zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1), (1 << 46) - 1

    def ref(i: int) -> float:
        h = (i * 40503 + salt) & m46
        h = ((h ^ (h >> 13)) * 2654435761) & m46
        return ((h >> 7) & 0xFFFFFF) / 2**24 - 0.5

    want = torch.tensor([[ref(r * 300 + c) for c in range(17, 290)] for r in range(2, 5)])
    assert torch.equal(synthetic(name, shape, region, seed), want)
    assert torch.equal(synthetic(name, shape, region, seed, torch.bfloat16), want.to(torch.bfloat16))
