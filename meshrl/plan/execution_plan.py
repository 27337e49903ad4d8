"""``CallPlan`` and ``ExecutionPlan``: where and how every call of the graph runs (plain data, JSON).

Shared by the planner (which scores and searches plans) and the runtime (which runs them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from .hardware import device_names
from ..layout.mesh import Layout, LayoutError, Mesh, Placement


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``devices_per_node`` devices of one kind; global rank = node * devices_per_node + local."""

    nodes: int = 1
    devices_per_node: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.devices_per_node < 1:
            raise UserError(
                f"cluster of {self.nodes} nodes x {self.devices_per_node} devices makes no sense: both must be >= 1"
            )

    @property
    def size(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node


@dataclass(frozen=True)
class CallPlan:
    """One call's mesh, layout and number of micro-batches (per data-parallel rank)."""

    mesh: Mesh
    layout: Layout
    micro_batches: int = 1

    def __post_init__(self) -> None:
        Placement(self.mesh, self.layout)  # validates size match
        if self.micro_batches < 1:
            raise LayoutError(f"micro_batches must be >= 1, got {self.micro_batches}")

    @property
    def placement(self) -> Placement:
        return Placement(self.mesh, self.layout)

    def to_dict(self) -> dict:
        return {"mesh": str(self.mesh), "layout": str(self.layout), "micro_batches": self.micro_batches}

    @classmethod
    def from_dict(cls, d: dict) -> "CallPlan":
        """{"mesh": "0-3" | "0,2" | [0, 1, 2, 3], "layout": "dp2tp2pp1", "micro_batches": 1}."""
        if not isinstance(d, dict):
            raise UserError(f"expected an object with mesh, layout and micro_batches, got {d!r}")
        missing = [k for k in ("mesh", "layout") if k not in d]
        if missing:
            raise UserError(f"lacks the key {missing[0]!r}")
        unknown = sorted(set(d) - {"mesh", "layout", "micro_batches"})
        if unknown:
            raise UserError(f"unknown key {unknown[0]!r} (keys: mesh, layout, micro_batches)")
        mb = d.get("micro_batches", 1)
        if isinstance(mb, bool) or not isinstance(mb, int):
            raise UserError(f"micro_batches must be a whole number >= 1, got {mb!r}")
        if not isinstance(d["layout"], str):
            raise UserError(f"layout must be a string such as 'dp2tp1pp1', got {d['layout']!r}")
        return cls(_mesh(d["mesh"]), Layout.parse(d["layout"]), mb)


PLAN_KEYS = ("cluster", "strategy", "keep_copies", "offload_frozen", "calls", "notes")
CLUSTER_KEYS = ("nodes", "devices_per_node", "device")


def _cluster(d: object) -> Cluster:
    """The plan's cluster object: known keys only, whole numbers, a known device."""
    if not isinstance(d, dict):
        raise UserError(f"'cluster' must be an object with {', '.join(CLUSTER_KEYS)}, got {d!r}")
    unknown = sorted(set(d) - set(CLUSTER_KEYS))
    if unknown:
        raise UserError(f"cluster: unknown key {unknown[0]!r} (keys: {', '.join(CLUSTER_KEYS)})")
    for k in ("nodes", "devices_per_node"):
        v = d.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"cluster key {k!r} must be a whole number >= 1, got {v!r}")
    device = d.get("device", "cpu")
    if device not in device_names():
        raise UserError(f"cluster key 'device': unknown device {device!r}; known devices: "
                        f"{', '.join(device_names())}")
    return Cluster(d.get("nodes", 1), d.get("devices_per_node", 1), device)


def _mesh(v: object) -> Mesh:
    """A mesh written as a string ('0-3', '0,2,4') or as a JSON list of ranks ([0, 1, 2])."""
    if isinstance(v, str):
        return Mesh.parse(v)
    if isinstance(v, list) and v and all(isinstance(r, int) and not isinstance(r, bool) for r in v):
        return Mesh(tuple(v))
    raise UserError(f"mesh must be ranks like \"0-3\", \"0,2\" or a list of ranks [0, 1, 2], got {v!r}")


@dataclass(frozen=True)
class ExecutionPlan:
    """{call name -> CallPlan} for a cluster. ``strategy`` records where the plan came from;
    ``keep_copies``: keep a role's copies in other calls' layouts between uses (memory for speed);
    by default a copy is dropped after its call and rebuilt by reallocation before the next one
    (a shadow actor generating on devices of its own is always kept).
    ``offload_frozen``: move a frozen role's (reference, reward) parameters to host memory after each
    of its calls whose mesh another call shares, and back to the device before its next use.

    Frozen: nothing edits a plan once it is made or loaded; a changed plan is a new one
    (``dataclasses.replace``)."""

    cluster: Cluster
    calls: dict[str, CallPlan]
    strategy: str = "custom"
    notes: dict = field(default_factory=dict)
    keep_copies: bool = False
    offload_frozen: bool = False

    def validate(self, call_names: list[str] | None = None, model_dims: dict[str, tuple[int, int]] | None = None,
                 call_roles: dict[str, str] | None = None) -> None:
        """Raise UserError naming the culprit: meshes outside the cluster, missing or unknown calls,
        layouts a model cannot take. ``model_dims``: role -> (num_heads, num_layers)."""
        for name, cp in self.calls.items():
            try:
                cp.mesh.check_world(self.cluster.size)
            except LayoutError as e:
                raise UserError(f"call {name}: {e}") from None
        if call_names is not None:
            missing = [n for n in call_names if n not in self.calls]
            extra = [n for n in self.calls if n not in call_names]
            if missing:
                raise UserError(f"plan has no entry for calls {missing}")
            if extra:
                raise UserError(f"plan names calls {extra} that the algorithm does not have")
        if model_dims and call_roles:
            for name, cp in self.calls.items():
                heads, layers = model_dims[call_roles[name]]
                try:
                    cp.layout.check_model(heads, layers)
                except LayoutError as e:
                    raise UserError(f"call {name}: {e}") from None

    def to_dict(self) -> dict:
        return {
            "cluster": {"nodes": self.cluster.nodes, "devices_per_node": self.cluster.devices_per_node,
                        "device": self.cluster.device},
            "strategy": self.strategy,
            "keep_copies": self.keep_copies,
            "offload_frozen": self.offload_frozen,
            "calls": {n: cp.to_dict() for n, cp in self.calls.items()},
            **({"notes": self.notes} if self.notes else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ExecutionPlan":
        """The plan a JSON object describes; UserError naming the key for anything it does not know."""
        if not isinstance(d, dict) or "calls" not in d or "cluster" not in d:
            raise UserError("an execution plan needs the keys 'cluster' and 'calls'")
        if "async" in d:
            raise UserError("'async' is no longer a plan key: generating one step off-policy changes the "
                            "results, so it is the algorithm's choice now; remove it from the plan and set "
                            "train.off_policy=1 in the config instead")
        unknown = sorted(set(d) - set(PLAN_KEYS))
        if unknown:
            raise UserError(f"unknown key {unknown[0]!r} (keys: {', '.join(PLAN_KEYS)})")
        cluster = _cluster(d["cluster"])
        if not isinstance(d["calls"], dict) or not d["calls"]:
            raise UserError(f"'calls' must be an object of call name -> call plan, got {d['calls']!r}")
        calls = {}
        for n, c in d["calls"].items():
            try:
                calls[n] = CallPlan.from_dict(c)
            except UserError as e:
                raise UserError(f"call {n}: {e}") from None
        flags = {k: d.get(k, False) for k in ("keep_copies", "offload_frozen")}
        for k, v in flags.items():
            if not isinstance(v, bool):
                raise UserError(f"plan key {k!r} must be true or false, got {v!r}")
        if not isinstance(d.get("strategy", ""), str) or not isinstance(d.get("notes", {}), dict):
            raise UserError("plan key 'strategy' must be a string and 'notes' an object")
        return cls(cluster, calls, d.get("strategy", "custom"), d.get("notes", {}), **flags)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ExecutionPlan":
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> "ExecutionPlan":
        p = Path(path)
        if not p.is_file():
            raise UserError(f"plan file not found: {path}")
        try:
            return cls.from_json(p.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"plan file {path} is not valid JSON: {e}") from None
        except UserError as e:
            raise UserError(f"plan file {path}: {e}") from None
