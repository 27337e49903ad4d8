"""Each role's model on this rank: its home ParallelModel (with the optimizer, for a trained role)
and one copy per other placement a call of the role uses, refreshed by reallocation.

A copy is temporary (DESIGN.md): after its call it is dropped and the next reallocation rebuilds it
from the home weights, unless the plan says ``keep_copies`` or the copy is a shadow actor (a
generation copy on devices the home does not use, as in the disaggregated strategy), which stays.
With the plan's ``offload_frozen``, a frozen role's parameters wait in host memory between uses.

Initial weights are made once on rank 0 (the preset's seeded init and the demo's SFT warm-up, as
the single-process trainer does) and broadcast, so every plan starts from bit-identical weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..algo import setup
from ..algo.graph import Graph
from ..config import Config
from ..model.config import ModelConfig
from ..parallel import comm
from ..parallel.data import AdamWConfig
from ..parallel.groups import GroupCache, RankGroups
from ..layout.mesh import Placement
from ..parallel.model import ParallelModel
from ..plan.execution_plan import ExecutionPlan
from ..realloc.executor import Reallocator
from ..layout.realloc_plan import realloc_plan
from ..layout.shardmap import shard_map
from .schedule import home_calls

VALUE_ROLES = ("critic", "reward")


def broadcast_state(state: dict[str, torch.Tensor], src: int = 0) -> dict[str, torch.Tensor]:
    """Make every rank's tensors equal to rank ``src``'s (same names and shapes on all ranks)."""
    for name in sorted(state):
        t = state[name].contiguous()
        comm.broadcast(t, src)
        state[name] = t
    return state


def initial_states(cfg: Config, tok, log, warm: bool = True
                   ) -> dict[str, tuple[ModelConfig | None, dict[str, torch.Tensor] | None]]:
    """role -> (model config, full HF-named state) at iteration 0, equal on every rank; the state is
    None for a rule reward. Rank 0 runs the SFT warm-up (not when resuming: the checkpoint holds
    every role's weights); the others receive its result."""
    torch.manual_seed(cfg.train.seed)
    actor = setup.load_policy(cfg, cfg.train.seed)
    if warm and dist.get_rank() == 0 and setup.warms_up(cfg):
        from ..algo.trainer import warmup_sft

        warmup_sft(actor, cfg, tok, log, progress=False)
    broadcast_state(dict(actor.state_dict()))  # in place: the dict's tensors are the parameters
    roles = setup.build_roles(cfg, actor)
    out = {}
    for name, role in roles.items():
        model = role.model
        out[name] = ((model.config, {k: v.detach().clone() for k, v in model.state_dict().items()})
                     if model is not None else (None, None))
    return out


def adamw_for(cfg: Config, role: str) -> AdamWConfig:
    """The single-process trainer's optimizer settings for a trained role (meshrl/algo/setup.py)."""
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

    def handle(self, placement: Placement) -> ParallelModel | None:
        return self.models.get(placement)

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
        for p in pm.named.values():
            p.data = p.data.to("cpu", copy=True)
        self.offloads += 1

    @torch.no_grad()
    def reload(self) -> None:
        """Bring every offloaded model of the role on this rank back to its device."""
        for placement, device in self.offloaded.items():
            for p in self.models[placement].named.values():
                p.data = p.data.to(device)
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
    homes = home_calls(graph)
    trained = {c.role for c in graph.calls if c.kind == "train"}
    out: dict[str, RoleModels] = {}
    for role in graph.roles():
        mcfg, state = states[role]
        home = plan.calls[homes[role]].placement
        rm = RoleModels(role, mcfg, home, role in trained)
        out[role] = rm
        if state is None:
            continue
        placements = [home] + [plan.calls[c.name].placement for c in graph.calls if c.role == role]
        for pl in dict.fromkeys(placements):  # unique, in order
            if rank not in pl.mesh:
                continue
            optim = adamw_for(cfg, role) if rm.trained and pl == home else None
            rm.models[pl] = ParallelModel.from_state(mcfg, pl, cache, state, value_head=role in VALUE_ROLES,
                                                     optim=optim, timeout_s=timeout_s)
            rm.dtype = rm.models[pl].dtype
    return out
