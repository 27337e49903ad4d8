"""Every layout with dp*tp*pp <= 8, on meshes of 1, 2, 4 and 8 real gloo ranks (sub-meshes included),
against the same model on one process: logits, per-token log-probs, loss, gradients, parameters
after two ZeRO-1 AdamW steps (and gathered back with full_state_dict), greedy generations.

Tolerance: relative difference (max |parallel - oracle| / max |oracle|, per tensor) at most 1e-5 in
float32 (meshrl.parallel.verify.TOLERANCE); generations must be token-for-token equal. The
differences come only from the order of the tp / dp / micro-batch sums (observed: <= 4e-6)."""

import pytest

from meshrl.commands.check import layouts_of_size
from meshrl.model.presets import get_preset
from meshrl.parallel.data import AdamWConfig
from meshrl.parallel.verify import TOLERANCE, Probe, run_jobs, summarize
from meshrl.runtime.launch import RankPool

TINY = Probe("tiny")
# Tied embeddings (summed over the first and last stage when pp > 1) and q/k/v biases.
TIED = Probe(get_preset("tiny").replace(tie_word_embeddings=True, attention_bias=True, model_type="qwen2"),
             seed=3)
VALUE = Probe("tiny", seed=5, value_head=True)
NO_CLIP = Probe("tiny", seed=3, optim=AdamWConfig(lr=1e-5, max_grad_norm=0.0))  # grad norm still reported


@pytest.fixture(scope="module")
def pool():
    with RankPool(8, timeout=240) as p:
        yield p


def _lay(dtp: tuple[int, int, int]) -> str:
    return "dp{}tp{}pp{}".format(*dtp)


def _check(pool: RankPool, jobs: list[tuple[Probe, str]]) -> list[dict]:
    """Run the jobs at the same time on their disjoint meshes; assert each matches its oracle."""
    per_rank = pool.run(run_jobs, jobs)
    records = []
    for i, (_, text) in enumerate(jobs):
        rec = summarize(text, [r[1] if r is not None and r[0] == i else None for r in per_rank])
        assert rec["ok"], rec
        records.append(rec)
    return records


# size 8: every layout on all ranks
@pytest.mark.parametrize("layout", [_lay(x) for x in layouts_of_size(8)])
def test_eight_ranks(pool, layout):
    _check(pool, [(TINY, f"{layout}@0-7")])


# size 4: two layouts at once, one on ranks 0-3 and one on the sub-mesh 4-7
SIZE4 = [_lay(x) for x in layouts_of_size(4)]


@pytest.mark.parametrize("pair", [(SIZE4[i], SIZE4[-1 - i]) for i in range(3)], ids=lambda p: "+".join(p))
def test_four_ranks_two_meshes(pool, pair):
    _check(pool, [(TINY, f"{pair[0]}@0-3"), (TINY, f"{pair[1]}@4-7")])


def test_two_and_one_rank_meshes(pool):
    """Every 2-rank layout on its own sub-mesh, plus 1-rank meshes at both ends, all at once."""
    two = [_lay(x) for x in layouts_of_size(2)]
    _check(pool, [(TINY, "dp1tp1pp1@0"), (TINY, f"{two[0]}@1-2"), (TINY, f"{two[1]}@3-4"),
                  (TINY, f"{two[2]}@5-6"), (TINY, "dp1tp1pp1@7")])


def test_two_different_models_on_disjoint_meshes_at_once(pool):
    """Groups are per mesh: a tied-embedding model with biases on 4-7 runs while the plain model runs
    on 0-3, each with pipeline and tensor parallelism."""
    recs = _check(pool, [(TINY, "dp2tp2pp1@0-3"), (TIED, "dp1tp2pp2@4-7")])
    assert [r["ranks"] for r in recs] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("layout", ["dp1tp1pp2@0-1", "dp1tp8pp1@0-7", "dp2tp2pp2@0-7", "dp1tp2pp4@0-7"])
def test_tied_embeddings_and_biases(pool, layout):
    _check(pool, [(TIED, layout)])


def test_value_model(pool):
    recs = _check(pool, [(VALUE, "dp2tp2pp1@0-3"), (VALUE, "dp1tp2pp2@4-7")])
    assert all(r["logits_max_rel_diff"] <= TOLERANCE for r in recs)  # the values


def test_optimizer_state_is_sharded_over_dp(pool):
    per_rank = pool.run(run_jobs, [(TINY, "dp4tp1pp2@0-7")])
    for _, r in per_rank:
        # each dp rank holds AdamW state for a quarter of its stage's parameters (plus rounding)
        assert r["optim_numel"] <= r["param_numel"] // 4 + 100
        assert r["optim_numel"] >= r["param_numel"] // 4 - 100


def test_gradient_norm_without_clipping(pool):
    # max_grad_norm=0 turns clipping off; every layout still reports the one-process norm (checked
    # with the gradients in "grads_max_rel_diff"), not NaN.
    _check(pool, [(NO_CLIP, "dp2tp2pp1@0-3"), (NO_CLIP, "dp1tp2pp2@4-7")])


# The families beyond LLaMA. MoE: experts sharded over tp (1 expert a rank at tp=8), the router
# replicated; Qwen3: per-head q/k norms (summed over tp), KV heads replicated at tp=8; Mixtral's
# names and float32 routing weights; Llama 3.x RoPE scaling (positions run past its original 8).
MOE = Probe("tiny-moe", seed=1)
MIXTRAL = Probe(get_preset("tiny-moe").replace(model_type="mixtral", intermediate_size=64, moe_intermediate_size=64,
                                               num_experts_per_tok=3), seed=2)
QWEN3 = Probe("tiny-qwen3", seed=1)
LLAMA3 = Probe("tiny-llama3", seed=1)


@pytest.mark.parametrize("layout", ["dp1tp8pp1@0-7", "dp2tp2pp2@0-7", "dp1tp4pp2@0-7"])
def test_moe_experts_over_tp(pool, layout):
    _check(pool, [(MOE, layout)])


@pytest.mark.parametrize("jobs", [[(QWEN3, "dp1tp8pp1@0-7")], [(QWEN3, "dp1tp2pp4@0-7")],
                                  [(MIXTRAL, "dp1tp4pp1@0-3"), (LLAMA3, "dp2tp2pp1@4-7")],
                                  [(MIXTRAL, "dp2tp1pp2@0-3"), (LLAMA3, "dp1tp4pp1@4-7")]],
                         ids=["qwen3-tp8", "qwen3-tp2pp4", "mixtral-tp4+llama3-dp2tp2", "mixtral-dp2pp2+llama3-tp4"])
def test_families(pool, jobs):
    _check(pool, jobs)


def _aux_grads(layout: str) -> float | None:
    """Worker: the balance loss alone (ppo.moe_aux_coef's term) on tiny-moe under ``layout``, vs one
    process (LocalHandle, the whole batch in one micro-batch): the largest relative gradient
    difference over this rank's shards, or None outside the mesh."""
    import torch.distributed as dist

    from meshrl.algo.handles import LocalHandle
    from meshrl.layout.mesh import Placement
    from meshrl.parallel.groups import GroupCache
    from meshrl.parallel.model import ParallelModel
    from meshrl.parallel.verify import rel_diff

    probe, pl = MOE, Placement.parse(layout)
    model, batch = probe.build(), probe.batch()
    batch = {k: batch[k] for k in ("input_ids", "attention_mask")}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rows = batch["input_ids"].shape[0]

    def zero(out, mb):
        return 0.0 * out.logprobs.sum()

    LocalHandle(model).forward_backward(batch, zero, 1, moe_aux=0.5 / rows)
    want = {n: p.grad for n, p in model.named_parameters()}
    pm = ParallelModel.create(probe.config(), pl, GroupCache(), lambda n, sl: state[n][
        tuple(slice(a, b) for a, b in sl)].clone(), optim=probe.optim)
    if pm is None:
        return None
    d = pl.coords_of(dist.get_rank())[0]
    mine = {k: v.tensor_split(pl.layout.dp)[d] for k, v in batch.items()}
    pm.forward_backward(mine, zero, 2, moe_aux=0.5 / rows)
    worst = 0.0
    for name, g in pm.local_grads().items():
        sl = pm.sm.slice_of(dist.get_rank(), name)
        ref = want[name][tuple(slice(a, b) for a, b in sl)]
        if ref.abs().max() > 0:
            worst = max(worst, rel_diff(g, ref))
    assert want["model.layers.0.mlp.gate.weight"].abs().max() > 0
    return worst


@pytest.mark.parametrize("layout", ["dp2tp2pp2@0-7", "dp1tp4pp2@0-7"])
def test_moe_balance_loss_gradient_under_layouts(pool, layout):
    got = [r for r in pool.run(_aux_grads, layout) if r is not None]
    assert len(got) == 8 and max(got) <= TOLERANCE, got


# Pipelined decoding with micro-batches in flight (meshrl/parallel/generate_micro.py): 7 prompts
# (not divisible by the micro-batch count) with an end-of-sequence token that ends rows at
# different steps, greedy and sampled with temperature, top-k and top-p, against one process.
MICRO_JOBS = [("dp1tp1pp2@0-1", 2), ("dp1tp2pp2@2-5", 2), ("dp1tp1pp2@6-7", 3)]


def _micro_generate(jobs: list[tuple[str, int]]) -> dict | None:
    """Worker: this rank's micro-batched generations vs ``generate`` on one process (tokens, masks
    equal; largest log-prob difference), or None outside every mesh."""
    import torch
    import torch.distributed as dist

    from meshrl.layout.mesh import Placement
    from meshrl.model.checkpoint import build_model
    from meshrl.model.generation import GenerationConfig, generate
    from meshrl.parallel.groups import GroupCache
    from meshrl.parallel.model import ParallelModel

    model = build_model("tiny", seed=11)
    cache, pls = GroupCache(), [Placement.parse(t) for t, _ in jobs]
    pms = [ParallelModel.from_state(model.config, pl, cache, model.state_dict()) for pl in pls]
    mine = [(pm, m) for pm, (_, m) in zip(pms, jobs, strict=True) if pm is not None]
    if not mine:
        return None
    (pm, m), = mine
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (2 + i % 5,), generator=gen).tolist() for i in range(7)]
    seeds = [100 + i for i in range(7)]
    res = {"rank": dist.get_rank(), "tokens_equal": True, "lp_diff": 0.0, "lengths": []}
    for greedy in (True, False):
        cfg = GenerationConfig(max_new_tokens=8, greedy=greedy, temperature=0.8, top_k=40, top_p=0.9,
                               pad_token_id=256)
        free = generate(model, prompts, cfg, seeds).responses
        cfg.eos_token_id = int(free[0, 2])  # row 0 ends at step 2 (or before); others later or never
        want = generate(model, prompts, cfg, seeds)
        got = pm.generate(prompts, cfg, None if greedy else seeds, micro_batches=m)
        res["tokens_equal"] &= bool(torch.equal(got.responses, want.responses)
                                    and torch.equal(got.response_mask, want.response_mask))
        res["lp_diff"] = max(res["lp_diff"], float((got.response_logprobs - want.response_logprobs).abs().max()))
        res["lengths"].append(sorted(set(want.response_mask.sum(1).tolist())))
    return res


def test_micro_batched_generation_equals_one_process(pool):
    got = [r for r in pool.run(_micro_generate, MICRO_JOBS) if r is not None]
    assert len(got) == 8
    for r in got:
        assert r["tokens_equal"], r
        assert r["lp_diff"] <= 1e-4, r
        assert all(len(lens) >= 2 for lens in r["lengths"]), r  # rows really end at different steps


# A shared prefix and repeated prompts (meshrl/model/generation.py PromptBatch), prefilled once, through
# tensor-parallel and pipelined stages (micro_batches=1: the plain loop, where sharing applies):
# the tokens of one process prefilling every row in full.
SHARED_JOBS = ["dp1tp2pp1@0-1", "dp1tp1pp2@2-3", "dp1tp2pp2@4-7"]


def _shared_generate(layouts: list[str]) -> dict | None:
    import torch
    import torch.distributed as dist

    from meshrl.layout.mesh import Placement
    from meshrl.model import generation
    from meshrl.model.checkpoint import build_model
    from meshrl.model.generation import GenerationConfig, generate
    from meshrl.model.prompt_batch import SHARED_PREFIX_MIN
    from meshrl.parallel.groups import GroupCache
    from meshrl.parallel.model import ParallelModel

    model = build_model("tiny", seed=11)
    cache = GroupCache()
    pms = [ParallelModel.from_state(model.config, Placement.parse(t), cache, model.state_dict()) for t in layouts]
    mine = [pm for pm in pms if pm is not None]
    if not mine:
        return None
    system = list(range(40, 40 + SHARED_PREFIX_MIN + 3))
    prompts = [system + [60 + i] * (1 + i % 3) for i in range(4)] * 2
    seeds = [300 + i for i in range(len(prompts))]
    cfg = GenerationConfig(max_new_tokens=8, temperature=0.8, top_k=40, pad_token_id=256)
    real = generation.PromptBatch.of
    generation.PromptBatch.of = lambda *a, **k: real(*a, **{**k, "share": False})
    want = generate(model, prompts, cfg, seeds)
    generation.PromptBatch.of = real
    got = mine[0].generate(prompts, cfg, seeds, micro_batches=1)
    return {"rank": dist.get_rank(), "tokens_equal": bool(torch.equal(got.responses, want.responses)),
            "lp_diff": float((got.response_logprobs - want.response_logprobs).abs().max())}


def test_shared_prompts_generate_under_layouts_as_one_process_in_full(pool):
    got = [r for r in pool.run(_shared_generate, SHARED_JOBS) if r is not None]
    assert len(got) == 8
    for r in got:
        assert r["tokens_equal"] and r["lp_diff"] <= 1e-5, r
