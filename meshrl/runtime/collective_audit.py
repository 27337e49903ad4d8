"""The collective audit of a dry run: what every simulated rank sent through meshrl.parallel.comm,
and whether the members of each group issued the same sequence (a hang, or a silent corruption,
caught before it happens).

``RankLedger`` is installed as comm's audit (``comm.set_audit``) on one rank: each call is recorded
as an ``Op`` (the step it happened in, kind, the group's ranks and plane, shapes, dtypes, peer).
``audit`` compares the ledgers:

- a collective (all_reduce, all_gather, broadcast, barrier, the object collectives): every
  simulated member of the group must issue the same sequence of (kind, shapes, dtypes, root) on it;
- point to point: the sends of a rank to a peer and the peer's receives from it must match one for
  one, in order, in shape and dtype (gloo and NCCL match them by order).

A ``Mismatch`` names the step, the ranks, the group and the two sides. Object collectives carry no
tensor here: the fake group moves no object (comm keeps each rank's own), so only their order and
root are checked. Transfer steps' batch parts go through the dry run's mailbox, not comm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..parallel import comm

P2P = ("send", "recv")


@dataclass(frozen=True)
class Op:
    step: str
    kind: str
    group: tuple[int, ...]
    plane: str  # "data" | "control"
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    peer: int | None

    def what(self) -> str:
        """The op as a mismatch message shows it (step excluded)."""
        sh = ", ".join(f"{list(s)} {d}" for s, d in zip(self.shapes, self.dtypes, strict=True))
        peer = f" peer {self.peer}" if self.peer is not None else ""
        return f"{self.kind}({sh}){peer}"

    def key(self) -> tuple:
        """What group members must agree on."""
        if self.kind in P2P:  # a send matches the peer's receive
            return ("p2p", self.shapes, self.dtypes)
        return (self.kind, self.shapes, self.dtypes, self.peer)


@dataclass
class RankLedger:
    """One rank's record of its communication calls (``note`` is comm's audit hook)."""

    rank: int
    step: str = "build"
    ops: list[Op] = field(default_factory=list)
    _ranks: dict[int, tuple[tuple[int, ...], str]] = field(default_factory=dict)

    def _group(self, group) -> tuple[tuple[int, ...], str]:
        key = id(group)
        if key not in self._ranks:
            ranks = tuple(range(dist.get_world_size())) if group is None else tuple(dist.get_process_group_ranks(group))
            plane = "control" if group is None or id(group) in comm._ctrl_ids else "data"
            self._ranks[key] = (ranks, plane)
        return self._ranks[key]

    def note(self, kind: str, group, tensors: tuple = (), peer: int | None = None) -> None:
        ranks, plane = self._group(group)
        ts = [t for t in tensors if isinstance(t, torch.Tensor)]
        self.ops.append(Op(self.step, kind, ranks, plane, tuple(tuple(t.shape) for t in ts),
                           tuple(str(t.dtype).replace("torch.", "") for t in ts), peer))


@dataclass(frozen=True)
class Mismatch:
    step: str
    group: tuple[int, ...]
    ranks: tuple[int, int]
    index: int
    first: str
    second: str

    def message(self) -> str:
        return (f"step '{self.step}': ranks {self.ranks[0]} and {self.ranks[1]} disagree on collective "
                f"#{self.index} of group {_short(self.group)}: {self.first} against {self.second}")

    def to_dict(self) -> dict:
        return {"step": self.step, "group": list(self.group), "ranks": list(self.ranks), "index": self.index,
                "first": self.first, "second": self.second, "message": self.message()}


def _short(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"[{ranks[0]}-{ranks[-1]}]"
    return str(list(ranks))


def _first_difference(a: list[Op], b: list[Op]) -> int | None:
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i].key() != b[i].key():
            return i
    return None


def _side(ops: list[Op], i: int) -> tuple[str, str]:
    return (ops[i].step, ops[i].what()) if i < len(ops) else ("(end)", "nothing (the sequence ended)")


def audit(ledgers: dict[int, RankLedger]) -> tuple[int, list[Mismatch]]:
    """(ops checked, mismatches) over the simulated ranks' ledgers (see the module docstring)."""
    by_group: dict[tuple, dict[int, list[Op]]] = {}
    p2p: dict[tuple[int, int, str], dict[str, list[Op]]] = {}
    for r, led in ledgers.items():
        for op in led.ops:
            if op.kind in P2P:
                pair = (r, op.peer) if op.kind == "send" else (op.peer, r)
                p2p.setdefault((*pair, op.plane), {}).setdefault(op.kind, []).append(op)
            else:
                by_group.setdefault((op.group, op.plane), {}).setdefault(r, []).append(op)
    out: list[Mismatch] = []
    checked = 0
    for (group, _), seqs in by_group.items():
        members = sorted(m for m in group if m in ledgers)
        ref = members[0]
        for m in members[1:]:
            a, b = seqs.get(ref, []), seqs.get(m, [])
            checked += min(len(a), len(b))
            i = _first_difference(a, b)
            if i is not None:
                (step, x), (_, y) = _side(a, i), _side(b, i)
                out.append(Mismatch(step if step != "(end)" else _side(b, i)[0], group, (ref, m), i, x, y))
    for (s, d, _), sides in p2p.items():
        if s not in ledgers or d not in ledgers:
            continue
        a, b = sides.get("send", []), sides.get("recv", [])
        checked += min(len(a), len(b))
        i = _first_difference(a, b)
        if i is not None:
            (step, x), (_, y) = _side(a, i), _side(b, i)
            out.append(Mismatch(step if step != "(end)" else _side(b, i)[0], (s, d), (s, d), i, x, y))
    return checked, out
