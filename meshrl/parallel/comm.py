"""Every collective and point-to-point call of meshrl, on two planes.

- **Data plane**: tensor data (activations, gradients, parameters, batch payloads) on the rank's
  compute device (``cuda:LOCAL_RANK`` under NCCL, the CPU under gloo), through the call's group.
- **Control plane**: objects, counts, metadata and float64 statistics, on the CPU through a gloo
  group made alongside each data group (and one for the world). NCCL moves only device tensors and
  deadlocks or fails on objects sent through it; keeping control traffic on gloo also keeps the
  small host-side numbers (``.item()``, logs) off the device stream.

Under gloo with strict mode off the two planes share one group (there is nothing to separate).
**Strict mode** (``MESHRL_STRICT_COMM=1``; the test suite turns it on in tests/conftest.py) makes
separate control groups on gloo too, and raises :class:`CommError` when a data-plane call gets a
tensor that is not on the compute device, or a control call is given a data-plane group: the same
mistakes that NCCL would reject (or hang on) on a GPU are caught on a CPU-only machine.

Under torch's ``fake`` backend (``meshrl plan --dry-run``, meshrl/runtime/dry_run.py) the control
groups are fake groups too, object collectives keep this rank's own object (a fake group moves no
data), and every call is reported to the dry run's collective audit (``set_audit``).

The compute device is the process's, not a group's: ``compute_device()`` is derived from the world
backend (override with ``set_compute_device`` in tests). Groups are always passed in explicitly;
the only module state is the map from a data group to its control twin and the world control group.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

ProcessGroup = dist.ProcessGroup
_ctrl_of: dict[int, ProcessGroup] = {}  # id(data group) -> its control (gloo) group
_ctrl_ids: set[int] = set()  # ids of every control group
_state: dict[str, Any] = {"world_ctrl": None, "device": None, "setup": False, "audit": None}


class CommError(RuntimeError):
    """A communication call on the wrong plane (strict mode)."""


def strict() -> bool:
    return os.environ.get("MESHRL_STRICT_COMM", "0") not in ("", "0")


def compute_device() -> torch.device:
    """This rank's compute device: the current CUDA device under NCCL, else the CPU."""
    if _state["device"] is not None:
        return _state["device"]
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def set_compute_device(device: torch.device | str | None) -> None:
    """Override the compute device (None: derive it from the backend again)."""
    _state["device"] = None if device is None else torch.device(device)


def _separate() -> bool:
    """Whether control groups are groups of their own (NCCL world, fake world, or strict mode)."""
    return dist.get_backend() != "gloo" or strict()


def _control_backend() -> str:
    """gloo, or fake in a fake world (a dry run: a gloo group cannot be made there)."""
    return "fake" if fake() else "gloo"


def fake() -> bool:
    """Whether this process's world is torch's fake backend (a dry run)."""
    return dist.is_initialized() and dist.get_backend() == "fake"


def set_audit(audit: Any) -> None:
    """Report every call to ``audit.note(kind, group, tensors, peer)`` (None: stop)."""
    _state["audit"] = audit


def _note(kind: str, group: ProcessGroup | None, tensors: tuple = (), peer: int | None = None) -> None:
    audit = _state["audit"]
    if audit is not None:
        audit.note(kind, group, tensors, peer)


def setup(timeout: datetime.timedelta | None = None) -> None:
    """Make the world's control group; call on every rank right after ``init_process_group``."""
    if _state["setup"]:
        return
    _state["setup"] = True
    if _separate():
        g = dist.new_group(backend=_control_backend(), timeout=timeout)
        _state["world_ctrl"] = g
        _ctrl_ids.add(id(g))


def forget() -> None:
    """Drop this module's references to the world's groups (call as the world ends, before
    ``destroy_process_group``): a group still referenced when the process exits is freed without
    its gloo threads joined (meshrl/runtime/run.py ``end_world``)."""
    _ctrl_of.clear()
    _ctrl_ids.clear()
    _state.update(world_ctrl=None, setup=False)


def new_group(ranks: list[int], timeout: datetime.timedelta) -> ProcessGroup:
    """A data group over ``ranks`` plus its control twin (world-collective: every rank calls it for
    every group, in the same order; non-members get non-member handles, as with dist.new_group)."""
    g = dist.new_group(ranks, timeout=timeout)
    if _separate():
        c = dist.new_group(ranks, timeout=timeout, backend=_control_backend())
    else:
        c = g
    if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
        _ctrl_of[id(g)] = c
        _ctrl_ids.add(id(c))
    return g


def control(group: ProcessGroup | None) -> ProcessGroup | None:
    """The control twin of data group ``group`` (None: the world's control group)."""
    if group is None:
        return _state["world_ctrl"]
    if id(group) in _ctrl_ids:
        return group
    try:
        return _ctrl_of[id(group)]
    except KeyError:
        raise CommError("control(): this group was not made by meshrl.parallel.comm.new_group") from None


# ---- checks ------------------------------------------------------------------------------------
def _check_data(*tensors: torch.Tensor) -> None:
    if not strict():
        return
    dev = compute_device()
    for t in tensors:
        if t.device != dev:
            raise CommError(f"data-plane communication got a tensor on {t.device} (shape {tuple(t.shape)}, "
                            f"{t.dtype}); this rank computes on {dev}: move it there first")


def _check_control(group: ProcessGroup | None) -> None:
    if not strict():
        return
    if group is None and _state["world_ctrl"] is not None:
        raise CommError("a control-plane call (objects, counts, statistics) was sent to the world's data "
                        "group; use comm.control(None)")
    if group is not None and id(group) not in _ctrl_ids:
        raise CommError("a control-plane call (objects, counts, statistics) was sent to a data-plane group; "
                        "use comm.control(group)")


# ---- data plane ----------------------------------------------------------------------------------
def all_reduce(t: torch.Tensor, group: ProcessGroup | None, op: dist.ReduceOp = dist.ReduceOp.SUM,
               async_op: bool = False):
    _check_data(t)
    _note("all_reduce", group, (t,))
    return dist.all_reduce(t, op=op, group=group, async_op=async_op)


def wait(work: dist.Work, timeout: datetime.timedelta) -> None:
    """Wait for asynchronous work (``async_op=True``) with a deadline: a rank that never joins
    the collective fails this one instead of hanging it."""
    work.wait(timeout)


def all_gather(parts: list[torch.Tensor], t: torch.Tensor, group: ProcessGroup | None) -> None:
    _check_data(t, *parts)
    _note("all_gather", group, (t,))
    dist.all_gather(parts, t, group=group)


def broadcast(t: torch.Tensor, src: int, group: ProcessGroup | None = None) -> None:
    _check_data(t)
    _note("broadcast", group, (t,), src)
    dist.broadcast(t, src, group=group)


def isend(t: torch.Tensor, dst: int, group: ProcessGroup | None = None, tag: int = 0) -> dist.Work:
    _check_data(t)
    _note("send", group, (t,), dst)
    return dist.isend(t, dst=dst, group=group, tag=tag)


def irecv(t: torch.Tensor, src: int, group: ProcessGroup | None = None, tag: int = 0) -> dist.Work:
    _check_data(t)
    _note("recv", group, (t,), src)
    return dist.irecv(t, src=src, group=group, tag=tag)


def p2p_op(send: bool, t: torch.Tensor, peer: int, group: ProcessGroup | None = None, tag: int = 0
           ) -> dist.P2POp:
    _check_data(t)
    _note("send" if send else "recv", group, (t,), peer)
    return dist.P2POp(dist.isend if send else dist.irecv, t, peer, group=group, tag=tag)


def batch_isend_irecv(ops: list[dist.P2POp]) -> list[dist.Work]:
    return dist.batch_isend_irecv(ops) if ops else []


# ---- control plane (CPU, gloo) -------------------------------------------------------------------
def reduce_floats(values: list[float], group: ProcessGroup | None) -> list[float]:
    """Sum a few float64 statistics over data group ``group``'s control twin (exact-order-free
    enough: float64 on the CPU). ``group`` None with one member is a no-op by the caller."""
    ctrl = control(group)
    t = torch.tensor(values, dtype=torch.float64)
    _check_control(ctrl)
    _note("all_reduce", ctrl, (t,))
    dist.all_reduce(t, group=ctrl)
    return values if fake() else t.tolist()


def broadcast_floats(values: list[float], src: int, group: ProcessGroup | None) -> list[float]:
    """Rank ``src``'s float64 values on every member of ``group`` (a data group; its twin is used)."""
    ctrl = control(group)
    t = torch.tensor(values, dtype=torch.float64)
    _check_control(ctrl)
    _note("broadcast", ctrl, (t,), src)
    dist.broadcast(t, src, group=ctrl)
    return values if fake() else t.tolist()


def gather_object(obj: Any, out: list | None, dst: int = 0, group: ProcessGroup | None = None) -> None:
    """``dist.gather_object`` on a control group (``group`` must come from ``control``)."""
    _check_control(group)
    _note("gather_object", group, (), dst)
    if fake():  # no data moves: the destination gets its own object in every slot
        if out is not None:
            out[:] = [obj] * len(out)
        return
    dist.gather_object(obj, out, dst=dst, group=group)


def all_gather_object(out: list, obj: Any, group: ProcessGroup | None = None) -> None:
    _check_control(group)
    _note("all_gather_object", group)
    if fake():
        out[:] = [obj] * len(out)
        return
    dist.all_gather_object(out, obj, group=group)


def broadcast_object(obj: Any, src: int = 0, group: ProcessGroup | None = None) -> Any:
    _check_control(group)
    _note("broadcast_object", group, (), src)
    if fake():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def send_count(n: int, dst: int, group: ProcessGroup | None = None) -> tuple[dist.Work, torch.Tensor]:
    """Non-blocking send of a count on a control group; keep the tensor alive until the work ends."""
    _check_control(group)
    t = torch.tensor([n], dtype=torch.long)
    _note("send", group, (t,), dst)
    return dist.isend(t, dst=dst, group=group), t


def recv_count(src: int, timeout: datetime.timedelta, group: ProcessGroup | None = None) -> int:
    _check_control(group)
    t = torch.empty(1, dtype=torch.long)
    _note("recv", group, (t,), src)
    dist.irecv(t, src=src, group=group).wait(timeout)
    return int(t.item())


def barrier(group: ProcessGroup | None = None, timeout: datetime.timedelta | None = None) -> None:
    """A barrier on a control group, with a deadline (an all-reduce of one CPU number: gloo's
    ``dist.barrier`` takes no timeout per call)."""
    _check_control(group)
    _note("barrier", group)
    work = dist.all_reduce(torch.zeros(1), group=group, async_op=True)
    work.wait(timeout or datetime.timedelta(seconds=300))
