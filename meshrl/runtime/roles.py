"""Each role's model on this rank: its home ParallelModel (with the optimizer, for a trained role)
and one copy per other placement a call of the role uses, refreshed by reallocation.

A copy is temporary (DESIGN.md): after its call it is dropped and the next reallocation rebuilds it
from the home weights, unless the plan says ``keep_copies`` or the copy is a shadow actor (a
generation copy on devices the home does not use, as in the disaggregated strategy), which stays.
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
from ..config import Config
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
from ..layout.shardmap import shard_map
from ..plan.steps import home_calls

VALUE_ROLES = ("critic", "reward")


def initial_states(cfg: Config, warmed: Path | None = None) -> dict[str, tuple[ModelConfig | None, object]]:
    """role -> (model config, SliceLoader of its iteration-0 weights), equal on every rank; the
    loader is None for a rule reward. Each rank reads only its own shards (parallel/load.py): from
    the checkpoint's safetensors or the preset's seeded init, as ``setup.build_roles`` would build
    them whole; after the SFT warm-up (``warmed``: its checkpoint, runtime/warmup.py) the actor's
    backbone comes from there."""
    torch.manual_seed(cfg.train.seed)
    seed, spec, dtype = cfg.train.seed, cfg.models.actor, torch_dtype(cfg.train.dtype)
    if warmed is not None:
        body = SafetensorsLoader(warmed, dtype=dtype)
        acfg = body.cfg
    elif spec.path:
        body = SafetensorsLoader(spec.path, dtype=dtype)
        acfg = body.cfg
    else:
        acfg = get_preset(spec.preset or "tiny")
        body = InitLoader(acfg, seed, dtype=dtype)
    out: dict[str, tuple[ModelConfig | None, object]] = {}
    if cfg.algo == "rm":  # models.reward.path, else the (SFT) actor's backbone + a random head
        rspec = cfg.models.reward
        out["reward"] = _from_path(rspec.path, True, seed + 3, dtype) or \
            (acfg, ValueFromCausal(body, InitLoader(acfg, seed + 3, value_head=True, dtype=dtype)))
        return out
    out["actor"] = (acfg, body)
    if cfg.algo == "sft":
        return out
    out["ref"] = _from_path(cfg.models.ref.path, False, 0, dtype) or (acfg, body)
    if cfg.algo == "dpo":
        return out
    if cfg.algo == "ppo":
        out["critic"] = _from_path(cfg.models.critic.path, True, seed + 1, dtype) or (acfg, ValueFromCausal(body))
    out["reward"] = _from_path(cfg.models.reward.path, True, 0, dtype) or (None, None)
    return out


def _from_path(path: str | None, value_head: bool, seed: int, dtype: torch.dtype):
    if not path:
        return None
    loader = SafetensorsLoader(path, value_head, seed, dtype)
    return loader.cfg, loader


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
                                             value_head=self.name in VALUE_ROLES, timeout_s=timeout_s)
        return stats.sent


def build_roles(cfg: Config, graph: Graph, plan: ExecutionPlan, states: dict, cache: GroupCache,
                timeout_s: float) -> dict[str, RoleModels]:
    """Every role's ParallelModels on this rank, created in one global order (roles, then home,
    then the other placements in call order) so that ranks create their process groups alike."""
    rank = dist.get_rank()
    join(cfg.gen.backend)  # the generation backend's groups, on every rank (meshrl/gen)
    homes = home_calls(graph)
    trained = {c.role for c in graph.calls if c.kind == "train"}
    out: dict[str, RoleModels] = {}
    for role in graph.roles():
        mcfg, load = states[role]
        home = plan.calls[homes[role]].placement
        rm = RoleModels(role, mcfg, home, role in trained)
        out[role] = rm
        if load is None:
            continue
        placements = [home] + [plan.calls[c.name].placement for c in graph.calls if c.role == role]
        for pl in dict.fromkeys(placements):  # unique, in order
            if rank not in pl.mesh:
                continue
            optim = adamw_for(cfg, role) if rm.trained and pl == home else None
            rm.models[pl] = ParallelModel.create(mcfg, pl, cache, load, value_head=role in VALUE_ROLES,
                                                 optim=optim, timeout_s=timeout_s,
                                                 activation_checkpointing=optim is not None
                                                 and cfg.train.activation_checkpointing,
                                                 grad_bucket_bytes=int(cfg.train.grad_bucket_mb * 2**20),
                                                 overlap_grad_reduce=cfg.train.overlap_grad_reduce,
                                                 compile_layers=cfg.train.compile is True)
            rm.dtype = rm.models[pl].dtype
        for c in graph.calls:  # one engine per generation placement this rank is in (tp = pp = 1: per replica)
            pl = plan.calls[c.name].placement
            if c.role == role and c.kind == "generate" and rank in pl.mesh and pl not in rm.generators:
                gen = make_generator(cfg.gen.backend, mcfg, rm.dtype, cfg.train.seed, mcfg.max_position_embeddings)
                if gen is not None:
                    rm.generators[pl] = gen
    return out
