"""Each role's model on this rank: its home ParallelModel (with the optimizer, for a trained role)
and one copy per other placement a call of the role uses, refreshed by reallocation.

A copy is temporary (DESIGN.md): after its call it is dropped and the next reallocation rebuilds it
from the home weights, unless the plan says ``keep_copies`` or the copy is a shadow actor (a
generation copy on devices the home does not use, as in the disaggregated strategy), which stays.
A temporary copy also starts dropped: the reallocation before its first call builds it.
With the plan's ``offload_frozen``, a frozen role's parameters wait in host memory between uses.

Initial weights: each rank reads only its own shards from the checkpoint, the preset's seeded
init or the sharded SFT warm-up's checkpoint (``initial_states``, runtime/warmup.py), so every plan
starts from bit-identical weights without any rank holding a whole model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..algo import setup
from ..algo.graph import Graph
from ..config import Config, own_model
from ..gen import Generator, join, make_generator
from ..model.config import ModelConfig
from ..model.presets import get_preset
from ..parallel.data import AdamWConfig
from ..parallel.precision import torch_dtype
from ..parallel.load import InitLoader, SafetensorsLoader, ValueFromCausal
from ..parallel.groups import GroupCache, RankGroups
from ..layout.mesh import Placement
from ..parallel.model import ParallelModel
from ..plan.execution_plan import ExecutionPlan
from ..realloc.executor import Reallocator
from ..layout.realloc_plan import realloc_plan
from ..layout.shardmap import check_shardable, shard_map
from ..plan.steps import home_calls, temporary

VALUE_ROLES = ("critic", "reward")


def actor_start(cfg: Config, dtype: torch.dtype) -> tuple[ModelConfig, SafetensorsLoader | InitLoader]:
    """The actor's model config and the loader of its weights before any training: the user's
    checkpoint (models.actor.path), else the preset's seeded init (what the SFT warm-up starts from)."""
    spec = cfg.models.actor
    if spec.path:
        body = SafetensorsLoader(spec.path, dtype=dtype)
        return body.cfg, body
    acfg = get_preset(spec.preset or "tiny")
    return acfg, InitLoader(acfg, cfg.train.seed, dtype=dtype)


def initial_states(cfg: Config, warmed: Path | None = None) -> dict[str, tuple[ModelConfig | None, object]]:
    """role -> (model config, SliceLoader of its iteration-0 weights), equal on every rank; the
    loader is None for a rule reward. Each rank reads only its own shards (parallel/load.py): from
    the checkpoint's safetensors or the preset's seeded init, as ``setup.build_roles`` would build
    them whole; after the SFT warm-up (``warmed``: its checkpoint, runtime/warmup.py) the actor's
    backbone comes from there. A role with a model of its own (config/models.py ``own_model``: a
    path, or a preset other than the actor's, which the planner prices) is that model; any other
    starts from the actor: the reference is the actor, a critic or reward model its backbone."""
    torch.manual_seed(cfg.train.seed)
    seed, dtype = cfg.train.seed, torch_dtype(cfg.train.dtype)
    if warmed is not None:
        body = SafetensorsLoader(warmed, dtype=dtype)
        acfg = body.cfg
    else:
        acfg, body = actor_start(cfg, dtype)
    out: dict[str, tuple[ModelConfig | None, object]] = {}
    if cfg.algo == "rm":  # its own model, else the (SFT) actor's backbone + a random head
        out["reward"] = _own(cfg, "reward", seed + 3, dtype, zero_head=False) or \
            (acfg, ValueFromCausal(body, InitLoader(acfg, seed + 3, value_head=True, dtype=dtype)))
        return out
    out["actor"] = (acfg, body)
    if cfg.algo == "sft":
        return out
    out["ref"] = _own(cfg, "ref", seed + 2, dtype) or (acfg, body)
    if cfg.algo == "dpo":
        return out
    if cfg.algo == "ppo":
        out["critic"] = _own(cfg, "critic", seed + 1, dtype) or (acfg, ValueFromCausal(body))
    out["reward"] = (None, None)  # a rule reward, unless a checkpoint (a preset only prices its calls)
    if cfg.models.reward.path:
        rm = SafetensorsLoader(cfg.models.reward.path, True, 0, dtype)
        out["reward"] = (rm.cfg, rm)
    return out


def _own(cfg: Config, role: str, seed: int, dtype: torch.dtype, zero_head: bool = True):
    """(config, loader) of ``role``'s own model (None if it starts from the actor): its checkpoint
    (a value role's missing head drawn from ``seed``), else its preset's init from ``seed`` (a
    critic's head zero, so early values are 0, as ``setup.value_model_like`` builds it)."""
    spec, value = getattr(cfg.models, role), role in VALUE_ROLES
    if not own_model(cfg.models, role):
        return None
    if spec.path:
        loader = SafetensorsLoader(spec.path, value, seed, dtype)
        return loader.cfg, loader
    mcfg = get_preset(spec.preset)
    init = InitLoader(mcfg, seed, value_head=value, dtype=dtype)
    return mcfg, (ValueFromCausal(init) if value and zero_head else init)


def adamw_for(cfg: Config, role: str) -> AdamWConfig:
    """The optimizer settings of a trained role (meshrl/algo/setup.py)."""
    lr, scales = setup.role_lr(cfg, role)
    return AdamWConfig(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.optim.weight_decay,
                       max_grad_norm=cfg.optim.grad_clip, lr_scales=scales)


@dataclass
class RoleModels:
    """One role on this rank. ``models``: placement -> this rank's ParallelModel (home and copies)."""

    name: str
    cfg: ModelConfig | None
    home: Placement
    trained: bool
    models: dict[Placement, ParallelModel] = field(default_factory=dict)
    reallocators: dict[Placement, Reallocator] = field(default_factory=dict)
    dtype: torch.dtype = torch.float32
    dropped: dict[Placement, RankGroups] = field(default_factory=dict)  # copies dropped after use
    drops: int = 0  # how many copies this rank dropped (the tests read it)
    offloaded: dict[Placement, torch.device] = field(default_factory=dict)  # -> the device to return to
    offloads: int = 0  # how many times this rank offloaded one of the role's models (the tests read it)
    # gen.backend other than meshrl: this rank's engine per generation placement (meshrl/gen), and the
    # iteration whose weights it holds
    generators: dict[Placement, Generator] = field(default_factory=dict)
    synced: dict[Placement, int] = field(default_factory=dict)
    compile_layers: bool = False  # train.compile: copies are built (and rebuilt) with compiled layers

    def handle(self, placement: Placement) -> ParallelModel | None:
        return self.models.get(placement)

    def rollout(self, placement: Placement, iteration: int) -> tuple[ParallelModel | Generator | None, float, int]:
        """The handle a generation call at ``placement`` runs on in ``iteration``, with the weight sync
        it took: (handle, seconds, bytes). meshrl's engine is the model itself (nothing to sync); an
        engine of its own (gen.backend=vllm) first loads this rank's slices of the generation layout
        (its ParallelModel there, refreshed by reallocation), once per iteration: weights change only
        between iterations' generation calls."""
        pm, gen = self.models.get(placement), self.generators.get(placement)
        if gen is None or pm is None:
            return pm, 0.0, 0
        if self.synced.get(placement) == iteration:
            return gen, 0.0, 0
        t0 = time.perf_counter()
        nbytes = gen.load_weights(pm.local_state().items())
        self.synced[placement] = iteration
        return gen, time.perf_counter() - t0, nbytes

    def drop(self, placement: Placement) -> None:
        """Free this rank's copy at ``placement`` (not the home); its groups stay for the rebuild."""
        if placement != self.home and placement in self.models:
            self.dropped[placement] = self.models.pop(placement).groups
            self.drops += 1

    @torch.no_grad()
    def offload(self, placement: Placement) -> None:
        """Move this rank's frozen model at ``placement`` to host memory (a copy, also on a CPU-only
        machine, so that the mechanism is the same everywhere). Parameters keep their identity:
        only ``.data`` moves, so hooks and views over the modules stay valid."""
        pm = self.models.get(placement)
        if self.trained or pm is None or placement in self.offloaded:
            return
        self.offloaded[placement] = pm.stage.device
        pin = pm.stage.device.type == "cuda"  # pinned host pages: the copies back run as DMA, async
        for p in pm.named.values():
            host = torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin)
            host.copy_(p.data, non_blocking=pin)
            p.data = host
        if pin:
            torch.cuda.current_stream(pm.stage.device).synchronize()  # host copies complete before use
        self.offloads += 1

    @torch.no_grad()
    def reload(self) -> None:
        """Bring every offloaded model of the role on this rank back to its device."""
        for placement, device in self.offloaded.items():
            for p in self.models[placement].named.values():
                p.data = p.data.to(device, non_blocking=p.data.is_pinned())
        self.offloaded.clear()

    def refresh(self, dst: Placement, rank: int, timeout_s: float) -> int:
        """Reallocate the home weights into the copy at ``dst`` (rebuilding a dropped copy from the
        received shards); returns bytes this rank sent."""
        dtype = self.dtype
        if dst not in self.reallocators:
            value = self.name in VALUE_ROLES
            plan = realloc_plan(shard_map(self.cfg, self.home, value), shard_map(self.cfg, dst, value),
                                dtype_bytes=torch.empty((), dtype=dtype).element_size())
            self.reallocators[dst] = Reallocator(plan, rank, timeout=timeout_s)
        src = self.models[self.home].local_state() if rank in self.home.mesh else {}
        rebuild = rank in dst.mesh and dst not in self.models
        out = self.models[dst].local_state() if rank in dst.mesh and not rebuild else None
        got, stats = self.reallocators[dst].run(src, out=out, dtype=dtype)
        if rebuild:  # this rank's shards are exactly the ShardMap slices the loader is asked for
            self.models[dst] = ParallelModel(self.cfg, self.dropped.pop(dst), lambda name, _sl: got[name],
                                             value_head=self.name in VALUE_ROLES, timeout_s=timeout_s,
                                             compile_layers=self.compile_layers)
        return stats.sent


def build_roles(cfg: Config, graph: Graph, plan: ExecutionPlan, states: dict, cache: GroupCache,
                timeout_s: float) -> dict[str, RoleModels]:
    """Every role on this rank: its home ParallelModel, and each other placement a call of the role
    uses, in one global order (roles, then home, then the other placements in call order) so that
    ranks ask for their process groups alike. Only copies that stay (a shadow actor, or all under
    ``keep_copies``: plan/steps.py ``temporary``) are built now; the others start dropped (their
    groups only), so the realloc step before each first use builds them from the home, as it
    rebuilds them in every later iteration: no temporary copy is resident before its call."""
    rank = dist.get_rank()
    join(cfg.gen.backend)  # the generation backend's groups, on every rank (meshrl/gen)
    homes = home_calls(graph)
    trained = {c.role for c in graph.calls if c.kind == "train"}
    out: dict[str, RoleModels] = {}
    for role in graph.roles():
        mcfg, load = states[role]
        home = plan.calls[homes[role]].placement
        rm = RoleModels(role, mcfg, home, role in trained, compile_layers=cfg.train.compile is True)
        out[role] = rm
        if load is None:
            continue
        rm.dtype = load.dtype  # every rank's, also outside the home mesh (the reallocations' dtype)
        uses: dict[Placement, list[str]] = {home: []}
        for c in graph.calls:
            if c.role == role:
                uses.setdefault(plan.calls[c.name].placement, []).append(c.name)
        for pl, names in uses.items():  # unique, in order
            if rank not in pl.mesh:
                continue
            if pl != home and any(temporary(graph, plan, n) for n in names):
                check_shardable(mcfg, pl)
                rm.dropped[pl] = cache.for_placement(pl, mcfg.num_key_value_heads)
                continue
            rm.models[pl] = _create(cfg, rm, pl, cache, load, timeout_s)
            if pl == home:
                rm.dtype = rm.models[pl].dtype
        _generators(cfg, graph, plan, rm, rank)
    return out


def _create(cfg: Config, rm: RoleModels, pl: Placement, cache: GroupCache, load, timeout_s: float
            ) -> ParallelModel:
    """This rank's model of ``rm`` at ``pl`` from ``load`` (with the optimizer at a trained role's home)."""
    optim = adamw_for(cfg, rm.name) if rm.trained and pl == rm.home else None
    return ParallelModel.create(rm.cfg, pl, cache, load, value_head=rm.name in VALUE_ROLES, optim=optim,
                                timeout_s=timeout_s,
                                activation_checkpointing=optim is not None and cfg.train.activation_checkpointing,
                                grad_bucket_bytes=int(cfg.train.grad_bucket_mb * 2**20),
                                overlap_grad_reduce=cfg.train.overlap_grad_reduce,
                                compile_layers=rm.compile_layers)


def _generators(cfg: Config, graph: Graph, plan: ExecutionPlan, rm: RoleModels, rank: int) -> None:
    """One engine per generation placement of ``rm`` this rank is in (gen.backend other than meshrl;
    tp = pp = 1: per replica), in the role's dtype; its weights come from the ParallelModel there
    (``rollout``), which the realloc step before the call has built or refreshed."""
    for c in graph.calls:
        pl = plan.calls[c.name].placement
        if c.role == rm.name and c.kind == "generate" and rank in pl.mesh and pl not in rm.generators:
            gen = make_generator(cfg.gen.backend, rm.cfg, rm.dtype, cfg.train.seed, rm.cfg.max_position_embeddings)
            if gen is not None:
                rm.generators[pl] = gen
