"""``Problem``: one planning question (graph, models, sizes, hardware, cluster) and its cached costs.

Everything the simulator and the search ask about a plan goes through here, so every cost is
computed once: call estimates keyed by what they depend on (layout, micro-batches, which groups
cross nodes), reallocation times keyed by the two placements up to a whole-node shift.
"""

from __future__ import annotations

import dataclasses

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..algo.graph import Graph
from ..cores import rank_threads
from ..cpu_features import auto_dtype
from ..errors import UserError
from ..config.models import own_model, role_spec
from ..model.config import ModelConfig
from ..model.hf_config import config_from_hf
from ..layout.mesh import Layout, LayoutError, Mesh, Placement
from ..layout.realloc_plan import link_bytes
from ..layout.shardmap import check_shardable
from .estimator import CallSpec, Estimate, RunShape, estimate_call, mesh_links
from .execution_plan import CallPlan, Cluster, ExecutionPlan
from .hardware import Hardware
from ..model.presets import get_preset
from ..algo.graph import graph_of
from .hardware_profile import get_hardware

VALUE_HEAD_ROLES = ("critic", "reward")
TOKEN_BYTES = 4  # int32 token ids and fp32 per-token values between calls
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2}  # train.dtype -> bytes per weight / activation element
SEQ_LEVEL_KEYS = ("scores", "env")  # a few numbers per sequence; every other key is one value per token


@dataclass
class Problem:
    graph: Graph
    models: dict[str, ModelConfig]  # role -> model
    shape: RunShape
    hw: Hardware
    cluster: Cluster
    off_policy: int = 0  # the config's train.off_policy: generation k iterations ahead
    # train.off_policy=auto: the largest lag the planner may choose (train.off_policy_max; plan/lag.py);
    # None: the config fixes the lag
    off_policy_max: int | None = None
    stream_by_lag: dict[int, int] = field(default_factory=dict)  # lag k -> train.stream_steps at k (0: whole)
    optimistic: bool = False  # unknown reallocation times read as 0 (see realloc_time)
    # roles that hold no weights at run time (a rule reward: no models.reward.path): their calls are
    # still timed as a model's (see docs/planner.md), but they take no memory
    weightless: tuple[str, ...] = ()
    # Measured over predicted seconds per call, refitted from a run (meshrl plan --calibrate,
    # plan/calibrate.py): every candidate of the call is priced at its estimate times this.
    call_scale: dict[str, float] = field(default_factory=dict)
    specs: dict[str, CallSpec] = field(init=False)
    _calls: dict = field(init=False, default_factory=dict)
    _realloc: dict = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.specs = {}
        for c in self.graph.calls:
            if c.role not in self.models:
                raise UserError(f"call {c.name} needs a model for role {c.role!r}; config models has none")
            self.specs[c.name] = CallSpec(c.name, c.role, c.kind, self.models[c.role],
                                          c.role in VALUE_HEAD_ROLES, c.n_samples)
        self.train_call = {c.role: c.name for c in self.graph.calls if c.kind == "train"}
        # streamed generation at this lag (train.stream_steps; re-done by dataclasses.replace at another lag)
        self.shape = dataclasses.replace(self.shape, stream_steps=self.stream_by_lag.get(self.off_policy, 0),
                                         stream_lag=self.off_policy)

    # ---- calls -----------------------------------------------------------------------------
    def fits_layout(self, name: str, layout: Layout) -> bool:
        if layout.tp > self.cluster.devices_per_node:
            return False
        try:
            check_shardable(self.specs[name].model, Placement(Mesh.range(0, layout.size), layout))
        except LayoutError:
            return False
        return True

    def call_estimate(self, name: str, cp: CallPlan) -> Estimate:
        est = self._calls.get((name, cp))
        if est is None:
            links = mesh_links(cp.mesh, cp.layout, self.cluster.devices_per_node)
            key = (name, cp.layout, cp.micro_batches, links)  # meshes alike up to position share it
            est = self._calls.get(key)
            if est is None:
                est = estimate_call(self.specs[name], self.shape, cp.layout, cp.micro_batches, self.hw, links)
                k = self.call_scale.get(name, 1.0)
                if k != 1.0:
                    est = replace(est, time_s=est.time_s * k, breakdown={p: v * k for p, v in est.breakdown.items()})
                self._calls[key] = est
            self._calls[(name, cp)] = est
        return est

    def home(self, plan: ExecutionPlan, role: str) -> str:
        """The call whose layout holds the role's weights: its train call, else its first call."""
        if role in self.train_call:
            return self.train_call[role]
        return next(c.name for c in self.graph.calls if c.role == role)

    # ---- moving weights and data --------------------------------------------------------------
    def realloc_time(self, role: str, src: Placement, dst: Placement) -> float:
        """Seconds to move ``role``'s weights from ``src`` to ``dst``: per rank, bytes sent and
        received over NVLink and IB (link_bytes, the runtime's own plan); the slowest rank decides."""
        if src == dst:
            return 0.0
        dpn = self.cluster.devices_per_node
        s_nodes = {r // dpn for r in src.mesh.ranks}
        d_nodes = {r // dpn for r in dst.mesh.ranks}
        if s_nodes & d_nodes:  # shared nodes: the time is the same under a shift by whole nodes
            sb = db = min(s_nodes | d_nodes) * dpn
        else:  # every byte crosses the network: only each mesh's shape inside its own nodes matters
            sb, db = min(s_nodes) * dpn, min(d_nodes) * dpn
        key = (role, src.layout, dst.layout, tuple(r - sb for r in src.mesh.ranks),
               tuple(r - db for r in dst.mesh.ranks), not (s_nodes & d_nodes))
        t = self._realloc.get(key)
        if t is None:
            if self.optimistic:
                return 0.0  # a lower bound: the search computes it only if the plan may win
            t = self._realloc[key] = self._link_time(role, src, dst)
        return t

    def _link_time(self, role: str, src: Placement, dst: Placement) -> float:
        moved = link_bytes(self.models[role], src, dst, role in VALUE_HEAD_ROLES)
        if not moved:
            return 0.0
        dpn = self.cluster.devices_per_node
        per_rank: dict[tuple[int, str], float] = {}
        for (s, d), n in moved.items():
            inter = s // dpn != d // dpn
            t = self.hw.transfer(n, inter)
            per_rank[(s, "send")] = per_rank.get((s, "send"), 0.0) + t
            per_rank[(d, "recv")] = per_rank.get((d, "recv"), 0.0) + t
        return max(per_rank.values()) + self.hw.step_latency

    def transfer_time(self, producer: str, consumer: str, src: CallPlan, dst: CallPlan) -> float:
        """Seconds to hand ``producer``'s outputs that ``consumer`` reads from one mesh to the other.
        Each producer DP rank sends its share and each consumer DP rank receives its share."""
        if src.mesh == dst.mesh and src.layout.dp == dst.layout.dp:
            return 0.0
        keys = [k for k in self.graph.call(consumer).inputs if self.graph.producers.get(k) == producer]
        seqs = self.specs[producer].sequences(self.shape)
        per_seq = sum(TOKEN_BYTES * (1 if k in SEQ_LEVEL_KEYS else self.shape.seq_len) for k in keys)
        total = seqs * per_seq
        dpn = self.cluster.devices_per_node
        inter = len({r // dpn for r in src.mesh.ranks + dst.mesh.ranks}) > 1
        worst = max(total / src.layout.dp, total / dst.layout.dp)
        return self.hw.transfer(worst, inter) + self.hw.step_latency

    # ---- memory ------------------------------------------------------------------------------
    def device_memory(self, plan: ExecutionPlan) -> list[float]:
        """Peak bytes per device: resident weights (and optimizer state) of every role whose home
        is on the device, plus the largest transient need of any call that runs there (its
        activations / KV cache / gradients, and a temporary copy of weights not in the home layout).
        A partial plan (calls missing) gets a lower bound: missing calls add nothing."""
        transient = [0.0] * self.cluster.size
        homes = {role: self.home(plan, role) for role in self.graph.roles()}
        resident = self.resident_bytes(plan, homes)
        for name, cp in plan.calls.items():
            if self.specs[name].role in self.weightless:
                continue
            est = self.call_estimate(name, cp)
            copies = self._temporary_copy(plan, homes, name, cp, est)
            for r, own, copy in zip(cp.mesh.ranks, rank_transients(cp, est), copies, strict=True):
                transient[r] = max(transient[r], own + copy)
        return [a + b for a, b in zip(resident, transient, strict=True)]

    def resident_bytes(self, plan: ExecutionPlan, homes: dict[str, str]) -> list[float]:
        """Per device, the weights and optimizer state of every role whose home (``homes``: role ->
        call) is there, each rank its pipeline stage's."""
        resident = [0.0] * self.cluster.size
        for role, h in homes.items():
            if h in plan.calls and role not in self.weightless:
                home = plan.calls[h]
                for r, own in zip(home.mesh.ranks, rank_resident(home, self.call_estimate(h, home)), strict=True):
                    resident[r] += own
        return resident

    def call_memory(self, plan: ExecutionPlan) -> dict[str, tuple[float, int]]:
        """Per call: (peak bytes, rank) on its busiest rank while it runs: the resident weights and
        optimizer state of every role whose home is on that rank, plus the call's own transient need
        (and its temporary copy). What ``--validate`` compares with the measured peak."""
        out = {}
        for name, per_rank in self.rank_call_memory(plan).items():
            r = max(per_rank, key=per_rank.get)  # the first of the busiest, in mesh order
            out[name] = (per_rank[r], r)
        return out

    def rank_call_memory(self, plan: ExecutionPlan) -> dict[str, dict[int, float]]:
        """Per call and rank of its mesh: the predicted peak bytes while the call runs (as
        ``call_memory``, on every rank; what ``--dry-run`` compares rank by rank)."""
        homes = {role: self.home(plan, role) for role in self.graph.roles()}
        resident = self.resident_bytes(plan, homes)
        out = {}
        for name, cp in plan.calls.items():
            est = self.call_estimate(name, cp)
            copies = self._temporary_copy(plan, homes, name, cp, est)
            owns = [0.0] * cp.mesh.size if self.specs[name].role in self.weightless else rank_transients(cp, est)
            out[name] = {r: resident[r] + copy + own
                         for r, own, copy in zip(cp.mesh.ranks, owns, copies, strict=True)}
        return out

    def _temporary_copy(self, plan: ExecutionPlan, homes: dict, name: str, cp, est) -> list[float]:
        """Per rank of the call's mesh (in mesh order), the bytes of its weights held beside its
        role's home layout while it runs: its stage's (0 where the call is the home or runs in the
        home's placement)."""
        home = plan.calls.get(homes[self.specs[name].role])
        moved = home is not None and name != homes[self.specs[name].role] and cp.placement != home.placement
        return rank_weights(cp, est) if moved else [0.0] * cp.mesh.size

    def feasible(self, plan: ExecutionPlan) -> bool:
        return max(self.device_memory(plan)) <= self.hw.mem_bytes

    def iteration_flops(self, plan: ExecutionPlan) -> float:
        return sum(self.call_estimate(n, cp).flops for n, cp in plan.calls.items())


def rank_resident(cp, est) -> list[float]:
    """A home call's weights and optimizer state on each rank of its mesh, in mesh order: its
    pipeline stage's (Estimate.stage_share)."""
    if not est.stage_share:
        return [est.weights_bytes + est.state_bytes] * cp.mesh.size
    return [est.resident_on(cp.layout.coords(i)[2]) for i in range(cp.mesh.size)]


def rank_weights(cp, est) -> list[float]:
    """A call's weights on each rank of its mesh, in mesh order: its pipeline stage's."""
    if not est.stage_share:
        return [est.weights_bytes] * cp.mesh.size
    return [est.weights_on(cp.layout.coords(i)[2]) for i in range(cp.mesh.size)]


def rank_transients(cp, est) -> list[float]:
    """A call's transient bytes on each rank of its mesh, in mesh order: its pipeline stage's."""
    if not est.stage_transient:
        return [est.transient_bytes] * cp.mesh.size
    return [est.transient_on(cp.layout.coords(i)[2]) for i in range(cp.mesh.size)]


def model_for(spec, role: str) -> ModelConfig:
    """A role's ModelConfig from its config entry: a preset name or a Hugging Face directory."""

    if spec.path:
        p = Path(spec.path) / "config.json"
        if not p.is_file():
            raise UserError(f"models.{role}.path: {p} does not exist")
        try:
            return config_from_hf(json.loads(p.read_text()))
        except json.JSONDecodeError as e:
            raise UserError(f"models.{role}.path: {p} is not valid JSON ({e})") from None
    if not spec.preset:
        raise UserError(f"models.{role} needs a preset or a path")
    return get_preset(spec.preset)


def role_model(cfg, role: str) -> ModelConfig:
    """The ModelConfig ``role`` runs with: its own preset or checkpoint, else the actor's
    (config/models.py ``role_spec``: the runtime builds the same, runtime/roles.py)."""
    return model_for(role_spec(cfg.models, role), role if own_model(cfg.models, role) else "actor")


def problem_from_config(cfg, profile: str | None = None, off_policy: int | None = None) -> Problem:
    """The planning problem of a run config (meshrl.config.Config). ``off_policy``: k lets generation
    run k iterations ahead (k steps off-policy); default: the config's ``train.off_policy``. Under
    ``train.off_policy=auto`` the problem starts at lag 0 with ``off_policy_max`` set, and
    plan/lag.py ``choose_lag`` picks the lag with the plan."""

    graph = graph_of(cfg)
    models = {role: role_model(cfg, role) for role in graph.roles()}
    cluster = Cluster(cfg.cluster.nodes, cfg.cluster.devices_per_node, cfg.cluster.device)
    threads = getattr(getattr(cfg, "train", None), "threads", 0)  # per rank: as the runtime sets it
    hw = get_hardware(cfg.cluster.device, cfg.cluster.devices_per_node, profile,
                      rank_threads(threads, cfg.cluster.devices_per_node)[0])
    dtype = getattr(getattr(cfg, "train", None), "dtype", "auto")
    if dtype == "auto":  # as the runtime picks it on the cluster's devices
        dtype = auto_dtype(gpu=cfg.cluster.device != "cpu")
    if dtype in DTYPE_BYTES:  # weights, gradients and activations in it
        hw = dataclasses.replace(hw, dtype_bytes=DTYPE_BYTES[dtype])
    auto = cfg.train.off_policy == "auto" and off_policy is None
    off_policy = (0 if auto else cfg.train.off_policy) if off_policy is None else off_policy
    if off_policy < 0:
        raise UserError(f"train.off_policy must be >= 0, got {off_policy}")
    rule = cfg.algo != "rm" and "reward" in models and getattr(cfg.models.reward, "path", None) is None
    # every lag this problem may be priced at: its own, auto's range, `meshrl plan`'s per-k line (0, 1, 2, 4)
    top = max(off_policy, cfg.train.off_policy_max if auto else 0, 4)
    stream = {k: cfg.stream_steps_at(k) for k in range(top + 1)}
    return Problem(graph, models, RunShape.from_config(cfg), hw, cluster, off_policy,
                   cfg.train.off_policy_max if auto else None, {k: s for k, s in stream.items() if s},
                   weightless=("reward",) if rule else ())
