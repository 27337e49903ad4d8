"""Each role's model on this rank: its home ParallelModel (with the optimizer, for a trained role)
and one copy per other placement a call of the role uses, refreshed by reallocation.

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
from ..parallel.data import AdamWConfig
from ..parallel.groups import GroupCache
from ..parallel.mesh import Placement
from ..parallel.model import ParallelModel
from ..plan.execution_plan import ExecutionPlan
from ..realloc.executor import Reallocator
from ..realloc.plan import realloc_plan
from ..realloc.shardmap import shard_map
from .schedule import home_calls

VALUE_ROLES = ("critic", "reward")


def broadcast_state(state: dict[str, torch.Tensor], src: int = 0) -> dict[str, torch.Tensor]:
    """Make every rank's tensors equal to rank ``src``'s (same names and shapes on all ranks)."""
    for name in sorted(state):
        t = state[name].contiguous()
        dist.broadcast(t, src)
        state[name] = t
    return state


def initial_states(cfg: Config, tok, log, warm: bool = True
                   ) -> dict[str, tuple[ModelConfig | None, dict[str, torch.Tensor] | None]]:
    """role -> (model config, full HF-named state) at iteration 0, equal on every rank; the state is
    None for a rule reward. Rank 0 runs the SFT warm-up (not when resuming: the checkpoint holds
    every role's weights); the others receive its result."""
    torch.manual_seed(cfg.train.seed)
    actor = setup.load_policy(cfg, cfg.train.seed)
    if warm and dist.get_rank() == 0 and cfg.models.actor.path is None and cfg.sft.warmup:
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
    lr = cfg.optim.critic_lr if role in VALUE_ROLES else cfg.optim.lr
    return AdamWConfig(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.optim.weight_decay,
                       max_grad_norm=cfg.optim.grad_clip)


@dataclass
class RoleModels:
    """One role on this rank. ``models``: placement -> this rank's ParallelModel (home and copies)."""

    name: str
    cfg: ModelConfig | None
    home: Placement
    trained: bool
    models: dict[Placement, ParallelModel] = field(default_factory=dict)
    reallocators: dict[Placement, Reallocator] = field(default_factory=dict)

    def handle(self, placement: Placement) -> ParallelModel | None:
        return self.models.get(placement)

    def refresh(self, dst: Placement, rank: int, timeout_s: float) -> int:
        """Reallocate the home weights into the copy at ``dst``; returns bytes this rank sent."""
        dtype = next(iter(self.models.values())).dtype  # this rank holds the home, the copy or both
        if dst not in self.reallocators:
            value = self.name in VALUE_ROLES
            plan = realloc_plan(shard_map(self.cfg, self.home, value), shard_map(self.cfg, dst, value),
                                dtype_bytes=torch.empty((), dtype=dtype).element_size())
            self.reallocators[dst] = Reallocator(plan, rank, timeout=timeout_s)
        src = self.models[self.home].local_state() if rank in self.home.mesh else {}
        out = self.models[dst].local_state() if rank in dst.mesh else None
        _, stats = self.reallocators[dst].run(src, out=out, dtype=dtype)
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
    return out
