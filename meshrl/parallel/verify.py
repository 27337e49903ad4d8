"""Compare a model under a placement with the same model on one process (``meshrl check parallel``
and tests/parallel use this).

Every rank computes the single-process oracle itself (deterministic on CPU, cached per process),
runs its part of the parallel model, and compares its own shards with the matching ShardMap slices
of the oracle, so only a few numbers travel back to the caller. Compared: logits (this rank's
vocabulary slice of its replica's rows, at real tokens), per-token log-probs and entropies, the loss and the
gradients of the first step (before clipping), the parameters after ``steps`` AdamW steps (with
clipping), greedy generations, and sampled generations (top-k / top-p, per-row seeds). A difference
is ``max|parallel - oracle| / max|oracle|`` per tensor (relative to the tensor's scale), the largest
over tensors and ranks.

The process-level state below (one GroupCache, the oracle) belongs to the worker process that the
harness started; the parallel code itself receives the groups explicitly.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..model.config import ModelConfig, param_shapes
from .data import AdamWConfig
from .groups import GroupCache
from ..layout.mesh import Placement
from ..model.generation import generate, sequence_logprobs
from ..model.heads import HeadOutputs
from .model import ParallelModel
from ..model.presets import get_preset
from ..model.checkpoint import read_config
from ..model.checkpoint import build_model, load_pretrained
from ..model.generation import GenerationConfig

TOLERANCE = 1e-5  # float32; differences come only from the order of the tp/dp/micro-batch sums

_PROCESS: dict = {}  # "groups": GroupCache, ("oracle", key): results; see the module docstring


@dataclass(frozen=True)
class Probe:
    """One deterministic test case: a model (preset name or checkpoint dir, or a config), a batch,
    prompts, and the training settings."""

    model: str | ModelConfig = "tiny"
    seed: int = 0
    rows: int = 8
    seq: int = 12
    steps: int = 2
    gen_tokens: int = 6
    value_head: bool = False
    # eps=1e-6, not 1e-8: Adam divides by |g| + eps, so a gradient element near eps turns the
    # reduction-order noise of the gradients (~3e-9 absolute here) into a different update of up to
    # a third of lr; MoE experts, which see few tokens, have many such elements (their params then
    # differed by 1.3e-5 relative with grads equal to 3e-6). With 1e-6 that noise moves a parameter
    # by <= lr * 3e-9 / 1e-6, while a real optimizer-sharding fault still moves it by ~lr.
    optim: AdamWConfig = field(default_factory=lambda: AdamWConfig(lr=1e-5, eps=1e-6, weight_decay=0.01,
                                                                   max_grad_norm=1.0))

    def config(self) -> ModelConfig:
        if isinstance(self.model, ModelConfig):
            return self.model
        if os.path.isdir(self.model):
            return read_config(self.model)[0]
        return get_preset(self.model)

    def build(self) -> torch.nn.Module:
        """The model: loaded from the directory, or a random one whose biases and norm weights are
        perturbed too (HF's init makes them 0 and 1, which would hide a wrongly sliced bias)."""
        if isinstance(self.model, str) and os.path.isdir(self.model):
            return load_pretrained(self.model, value_head=self.value_head)
        model = build_model(self.config(), seed=self.seed, value_head=self.value_head)
        gen = torch.Generator().manual_seed(self.seed + 3)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias") or name.endswith("norm.weight"):
                    p.add_(torch.randn(p.shape, generator=gen), alpha=0.02)
        return model

    def batch(self) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask [rows, seq] with rows of different lengths, padded on the left
        (even rows) or the right (odd rows), and loss_mask [rows, seq-1] over real targets."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        ids = torch.randint(0, self.config().vocab_size, (self.rows, self.seq), generator=gen)
        mask = torch.zeros(self.rows, self.seq, dtype=torch.long)
        for i in range(self.rows):
            n = self.seq - (i % 4)
            if i % 2 == 0:
                mask[i, self.seq - n:] = 1
            else:
                mask[i, :n] = 1
        ids = ids.masked_fill(mask == 0, 0)
        loss_mask = (mask[:, 1:] * mask[:, :-1]).float()
        return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}

    def gen_config(self, greedy: bool):
        return GenerationConfig(max_new_tokens=self.gen_tokens, greedy=greedy, temperature=1.0, top_k=50,
                                top_p=0.95, pad_token_id=0)

    def seeds(self) -> list[int]:
        return [1000 * self.seed + i for i in range(self.rows)]

    def prompts(self) -> list[list[int]]:
        gen = torch.Generator().manual_seed(self.seed + 2)
        v = self.config().vocab_size
        return [torch.randint(0, v, (3 + i % 4,), generator=gen).tolist() for i in range(self.rows)]


def token_loss(out, mb: dict[str, torch.Tensor], n_tokens: float) -> torch.Tensor:
    """Cross-entropy summed over the micro-batch's real targets / tokens of the WHOLE mini-batch
    (or, for a value model, squared values summed the same way)."""
    if out.values is not None:
        return (out.values[:, 1:].pow(2) * mb["loss_mask"]).sum() / n_tokens
    return -(out.logprobs * mb["loss_mask"]).sum() / n_tokens


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def oracle(probe: Probe) -> dict:
    """The single-process results (cached per process)."""
    key = ("oracle", probe)
    if key in _PROCESS:
        return _PROCESS[key]

    model, batch = probe.build(), probe.batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    out: dict = {}
    with torch.no_grad():
        if probe.value_head:
            out["values"] = model(ids, mask)
        else:
            out["logits"] = model(ids, mask)
            out["logprobs"] = sequence_logprobs(model, ids, mask)
            z = out["logits"][:, :-1].float()
            out["entropy"] = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
            out["tokens"] = generate(model, probe.prompts(), probe.gen_config(True)).responses
            out["sampled"] = generate(model, probe.prompts(), probe.gen_config(False), probe.seeds()).responses
    o = probe.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                            foreach=False)
    named = dict(model.named_parameters())
    n_tokens = float(batch["loss_mask"].sum())
    out["loss"] = []
    for step in range(probe.steps):
        lp = None if probe.value_head else sequence_logprobs(model, ids, mask)
        vals = model(ids, mask) if probe.value_head else None
        loss = token_loss(HeadOutputs(logprobs=lp, values=vals), batch, n_tokens)
        loss.backward()
        out["loss"].append(loss.item())
        if step == 0:
            out["grads"] = {n: named[n].grad.clone() for n in param_shapes(probe.config(), probe.value_head)}
        clip = o.max_grad_norm if o.max_grad_norm > 0 else float("inf")  # <= 0: no clipping
        out.setdefault("grad_norm", []).append(
            float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=False)))
        opt.step()
        opt.zero_grad()
    out["params"] = {n: named[n].detach().clone() for n in param_shapes(probe.config(), probe.value_head)}
    _PROCESS[key] = out
    return out


def _rows(t: torch.Tensor, dp: int, d: int) -> torch.Tensor:
    return torch.tensor_split(t, dp, dim=0)[d]


def _max_slice_diff(local: dict[str, torch.Tensor], full: dict[str, torch.Tensor], slices: dict) -> float:
    worst = 0.0
    for name, sl in slices.items():
        want = full[name][tuple(slice(a, b) for a, b in sl)]
        if name not in local or local[name].shape != want.shape:  # not the ShardMap slice: a failure
            return float("inf")
        worst = max(worst, rel_diff(local[name], want))
    return worst


def run_jobs(jobs: list[tuple[Probe, str]], micro_batches: int = 2) -> tuple[int, dict] | None:
    """Worker side (call on every rank of the world): run each (probe, placement) job on its mesh,
    all at the same time (the meshes must be disjoint). Returns (job index, this rank's differences
    from the oracle), or None on ranks outside every mesh."""
    placements = [Placement.parse(text) for _, text in jobs]
    cache = _PROCESS.setdefault("groups", GroupCache())
    for (probe, _), placement in zip(jobs, placements, strict=True):  # collective, in one order
        cache.for_placement(placement, probe.config().num_key_value_heads)
    mine = [i for i, pl in enumerate(placements) if dist.get_rank() in pl.mesh]
    if len(mine) > 1:
        raise ValueError(f"rank {dist.get_rank()} is in several meshes of {[t for _, t in jobs]}")
    if not mine:
        return None
    probe, placement = jobs[mine[0]][0], placements[mine[0]]
    return mine[0], _run_one(probe, placement, cache, micro_batches)


def run_layout(probe: Probe, placement_text: str, micro_batches: int = 2) -> dict | None:
    """``run_jobs`` with one job: this rank's differences, or None outside the mesh."""
    out = run_jobs([(probe, placement_text)], micro_batches)
    return None if out is None else out[1]


def _run_one(probe: Probe, placement: Placement, cache: GroupCache, micro_batches: int) -> dict:
    ref, cfg, batch = oracle(probe), probe.config(), probe.batch()
    model = probe.build()
    initial = model.state_dict()
    pm = ParallelModel.from_state(cfg, placement, cache, initial, value_head=probe.value_head, optim=probe.optim)
    pm.dp_bucket_bytes = 256 << 10  # several gradient buckets even for the tiny model
    dp_n, (d, t, _) = placement.layout.dp, placement.coords_of(dist.get_rank())
    mine = {k: _rows(v, dp_n, d) for k, v in batch.items()}
    m = min(micro_batches, mine["input_ids"].shape[0])
    ids, mask = mine["input_ids"], mine["attention_mask"]
    res: dict = {"rank": dist.get_rank(), "layout": str(placement.layout)}
    vocab = cfg.vocab_size // placement.layout.tp
    # logits and values are compared at real tokens: a pad position's output means nothing, and it
    # differs where a micro-batch without left padding takes SDPA's causal path (model/transformer.py)
    real_tok = mask.bool()
    if probe.value_head:
        vals = pm.values(ids, mask, m)
        if vals is not None:
            res["values"] = rel_diff(vals[real_tok], _rows(ref["values"], dp_n, d)[real_tok])
    else:
        logits = pm.logits(ids, mask, m)
        if logits is not None:
            want = _rows(ref["logits"], dp_n, d)[..., t * vocab:(t + 1) * vocab]
            res["logits"] = rel_diff(logits[real_tok], want[real_tok])
            lp, ent = pm.logprobs(ids, mask, m, entropy=True)
            # compared where both the token and the one before it are real: the runtime trims
            # left-padding columns no row of the replica uses (their figures are 0, not the oracle's)
            real = (mask[:, 1:] * mask[:, :-1]).to(lp.dtype)
            res["logprobs"] = max(rel_diff(lp * real, _rows(ref["logprobs"], dp_n, d) * real),
                                  rel_diff(ent * real, _rows(ref["entropy"], dp_n, d) * real))
        else:
            pm.logprobs(ids, mask, m, entropy=True)  # the other stages take part in the pipeline
    loss_fn = functools.partial(token_loss, n_tokens=float(batch["loss_mask"].sum()))
    slices = pm.sm.params_of(dist.get_rank())
    losses, norms = [], []
    for step in range(probe.steps):
        losses.append(pm.forward_backward(mine, loss_fn, m))
        if step == 0:
            res["grads"] = _max_slice_diff(pm.local_grads(), ref["grads"], slices)
        norms.append(pm.optimizer_step())
    res["loss"] = max(abs(a - b) / abs(b) for a, b in zip(losses, ref["loss"], strict=True))
    res["grad_norm"] = max(abs(a - b) / abs(b) for a, b in zip(norms, ref["grad_norm"], strict=True))
    res["params"] = _max_slice_diff(pm.local_state(), ref["params"], slices)
    res["optim_numel"] = sum(c.numel() for c in pm.optimizer.chunks)
    res["param_numel"] = sum(p.numel() for p in pm.optimizer.params)
    full = pm.full_state_dict()
    if full is not None:
        res["full_state"] = max(rel_diff(full[n], ref["params"][n]) for n in ref["params"])
    if not probe.value_head:
        pm.load_local_state({n: cut_full(initial[n], sl) for n, sl in slices.items()})
        prompts, seeds = _rows_list(probe.prompts(), dp_n, d), _rows_list(probe.seeds(), dp_n, d)
        out = pm.generate(prompts, probe.gen_config(True))
        res["generate_equal"] = bool(torch.equal(out.responses, _rows(ref["tokens"], dp_n, d)))
        out = pm.generate(prompts, probe.gen_config(False), seeds)
        res["sample_equal"] = bool(torch.equal(out.responses, _rows(ref["sampled"], dp_n, d)))
    return res


def cut_full(full: torch.Tensor, sl) -> torch.Tensor:
    return full[tuple(slice(a, b) for a, b in sl)]


def _rows_list(items: list, dp: int, d: int) -> list:
    idx = torch.tensor_split(torch.arange(len(items)), dp)[d].tolist()
    return [items[i] for i in idx]


def missing_evidence(placement: Placement, per_rank: list[dict | None]) -> list[str]:
    """What the ranks of ``placement`` should have reported and did not: every rank its loss,
    gradients and parameters (and greedy/sampled generations for a language model), every rank of
    the last pipeline stage its logits or values, and some rank the gathered full state. A summary
    over the ranks that did report would pass on no evidence at all."""
    by_rank = {r["rank"]: r for r in per_rank if r is not None and "rank" in r}
    last = placement.layout.pp - 1
    lm = not any("values" in r for r in by_rank.values())
    out = []
    for rank in placement.mesh.ranks:
        r = by_rank.get(rank)
        if r is None:
            out.append(f"rank {rank}: no result")
            continue
        need = ["loss", "grad_norm", "grads", "params"] + (["generate_equal", "sample_equal"] if lm else [])
        if placement.coords_of(rank)[2] == last:
            need += ["logits", "logprobs"] if lm else ["values"]
        out += [f"rank {rank}: no {k}" for k in need if k not in r]
    if by_rank and not any("full_state" in r for r in by_rank.values()):
        out.append("no rank: full_state")
    return out


def summarize(placement_text: str, per_rank: list[dict | None]) -> dict:
    """Fold the per-rank answers of one placement into the DESIGN.md record; ``ok`` only if every
    rank of the mesh reported everything it should (``missing`` lists what did not come)."""
    placement = Placement.parse(placement_text)
    got = [r for r in per_rank if r is not None]
    missing = missing_evidence(placement, per_rank)
    worst = {k: _worst(*(r[k] for r in got if k in r))
             for k in ("logits", "logprobs", "values", "grads", "params", "loss", "full_state", "grad_norm")}
    rec = {"layout": str(placement.layout), "ranks": list(placement.mesh.ranks),
           "logits_max_rel_diff": _worst(worst["logits"], worst["values"]),
           "logprobs_max_rel_diff": _worst(worst["logprobs"]), "loss_max_rel_diff": _worst(worst["loss"]),
           "grads_max_rel_diff": _worst(worst["grads"], worst["grad_norm"]),
           "params_max_rel_diff": _worst(worst["params"], worst["full_state"]),
           "generate_equal": bool(got) and all(r.get("generate_equal", True) for r in got),
           "sample_equal": bool(got) and all(r.get("sample_equal", True) for r in got)}
    if missing:
        rec["missing"] = missing
    # what must be there is checked by missing_evidence; a figure no rank should report (a value
    # model's logprobs) is None and is not compared; a nan difference fails
    keys = ("logits_max_rel_diff", "logprobs_max_rel_diff", "loss_max_rel_diff", "grads_max_rel_diff",
            "params_max_rel_diff")
    rec["ok"] = not missing and rec["generate_equal"] and rec["sample_equal"] and all(
        rec[k] is None or rec[k] <= TOLERANCE for k in keys)
    return rec


def _worst(*values: float | None) -> float | None:
    """The largest of the reported values (None if none was; nan if any is nan)."""
    seen = [v for v in values if v is not None]
    if any(v != v for v in seen):
        return float("nan")
    return max(seen) if seen else None
