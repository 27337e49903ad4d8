"""``Mesh`` (an ordered set of global ranks) and ``Layout`` (dp x tp x pp): pure rank math.

No torch.distributed here: the planner imports this to reason about 1,000 GPUs on a laptop.

Rank order within a mesh follows Megatron / torchtitan (DeviceMesh dims ("pp", "dp", "tp")):
tp varies fastest, then dp, then pp. So the mesh's local index is

    i = (pp_idx * dp + dp_idx) * tp + tp_idx

which keeps a TP group on consecutive ranks (one node, NVLink) and puts PP across nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UserError


class LayoutError(UserError, ValueError):
    """A mesh or layout that cannot exist; the message names the culprit."""


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise LayoutError(f"layout {name} must be a positive integer, got {v!r}")

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"dp{self.dp}tp{self.tp}pp{self.pp}"

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """'dp2tp2pp1' (any order, missing axes = 1) -> Layout."""
        parts = re.findall(r"(dp|tp|pp)(\d+)", text)
        if not parts or "".join(a + b for a, b in parts) != text.replace(" ", ""):
            raise LayoutError(f"cannot parse layout {text!r}; expected something like 'dp2tp2pp1'")
        return cls(**{a: int(b) for a, b in parts})

    # ---- coordinates <-> local index -------------------------------------------------------
    def coords(self, local: int) -> tuple[int, int, int]:
        """Local index in the mesh -> (dp_idx, tp_idx, pp_idx)."""
        if not 0 <= local < self.size:
            raise LayoutError(f"local index {local} outside a layout of size {self.size}")
        return (local // self.tp) % self.dp, local % self.tp, local // (self.tp * self.dp)

    def local_index(self, dp: int, tp: int, pp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def check_model(self, num_heads: int, num_layers: int, vocab_size: int | None = None) -> None:
        """Raise LayoutError if this layout cannot shard a model of these sizes.

        tp must divide the attention heads (KV heads are replicated when tp exceeds them, see
        meshrl/parallel/tensor.py) and pp may not exceed the layers."""
        if num_heads % self.tp:
            raise LayoutError(f"tp={self.tp} does not divide the model's {num_heads} attention heads")
        if self.pp > num_layers:
            raise LayoutError(f"pp={self.pp} is larger than the model's {num_layers} layers")
        if vocab_size is not None and vocab_size % self.tp:
            raise LayoutError(f"tp={self.tp} does not divide the vocabulary size {vocab_size}")


@dataclass(frozen=True)
class Mesh:
    """An ordered tuple of global ranks (devices)."""

    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        ranks = tuple(int(r) for r in self.ranks)
        object.__setattr__(self, "ranks", ranks)
        if not ranks:
            raise LayoutError("a mesh needs at least one rank")
        if len(set(ranks)) != len(ranks):
            raise LayoutError(f"mesh ranks {list(ranks)} repeat a rank")
        if min(ranks) < 0:
            raise LayoutError(f"mesh ranks {list(ranks)} include a negative rank")

    @classmethod
    def range(cls, start: int, size: int) -> "Mesh":
        return cls(tuple(range(start, start + size)))

    @classmethod
    def parse(cls, text: str) -> "Mesh":
        """'4-7' or '0,1,4,5' or '0-1,4-5' -> Mesh."""
        ranks: list[int] = []
        try:
            for part in text.split(","):
                if "-" in part:
                    a, b = part.split("-")
                    ranks.extend(range(int(a), int(b) + 1))
                else:
                    ranks.append(int(part))
        except ValueError:
            raise LayoutError(f"cannot parse mesh {text!r}; expected ranks like '0-3' or '0,2,4'") from None
        return cls(tuple(ranks))

    @property
    def size(self) -> int:
        return len(self.ranks)

    def __str__(self) -> str:
        r = self.ranks
        if r == tuple(range(r[0], r[0] + len(r))):
            return f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0])
        return ",".join(map(str, r))

    def __contains__(self, rank: int) -> bool:
        return rank in self.ranks

    def check_world(self, world_size: int) -> None:
        bad = [r for r in self.ranks if r >= world_size]
        if bad:
            raise LayoutError(f"mesh {self} has ranks {bad} outside the world of {world_size} ranks")

    def overlaps(self, other: "Mesh") -> bool:
        return bool(set(self.ranks) & set(other.ranks))


@dataclass(frozen=True)
class Placement:
    """A layout on a mesh: the full description of where a model (or a call) lives."""

    mesh: Mesh
    layout: Layout

    def __post_init__(self) -> None:
        if self.mesh.size != self.layout.size:
            raise LayoutError(
                f"layout {self.layout} has {self.layout.size} ranks but mesh {self.mesh} has {self.mesh.size}"
            )

    @classmethod
    def parse(cls, text: str) -> "Placement":
        """'dp2tp2pp1@0-3' -> Placement."""
        if "@" not in text:
            raise LayoutError(f"cannot parse {text!r}; expected LAYOUT@RANKS such as 'dp2tp1pp1@0-1'")
        lay, ranks = text.split("@", 1)
        return cls(Mesh.parse(ranks), Layout.parse(lay))

    def __str__(self) -> str:
        return f"{self.layout}@{self.mesh}"

    def rank_of(self, dp: int, tp: int, pp: int) -> int:
        return self.mesh.ranks[self.layout.local_index(dp, tp, pp)]

    def holders(self) -> tuple[int, ...]:
        """The rank holding each dp replica's outputs of a call: tp index 0 on the last pipeline stage."""
        return tuple(self.rank_of(d, 0, self.layout.pp - 1) for d in range(self.layout.dp))

    def coords_of(self, rank: int) -> tuple[int, int, int]:
        """Global rank -> (dp_idx, tp_idx, pp_idx); LayoutError if the rank is not in the mesh."""
        if rank not in self.mesh.ranks:
            raise LayoutError(f"rank {rank} is not in mesh {self.mesh}")
        return self.layout.coords(self.mesh.ranks.index(rank))

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """All process groups along one axis ('dp', 'tp' or 'pp'), as tuples of global ranks."""
        lay = self.layout
        sizes = {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp}
        if axis not in sizes:
            raise LayoutError(f"unknown axis {axis!r}")
        out = []
        others = [a for a in ("dp", "tp", "pp") if a != axis]
        for i in range(sizes[others[0]]):
            for j in range(sizes[others[1]]):
                group = []
                for k in range(sizes[axis]):
                    c = {others[0]: i, others[1]: j, axis: k}
                    group.append(self.rank_of(c["dp"], c["tp"], c["pp"]))
                out.append(tuple(group))
        return out


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Balanced split of layers over pipeline stages: the first (num_layers % pp) stages get one more."""
    if pp > num_layers:
        raise LayoutError(f"pp={pp} is larger than the model's {num_layers} layers")
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out
