"""Bucketed transfer schedule of a ReallocPlan: what the executor sends, in which round. Pure.

Every (src, dst) link carries its transfers, in plan order, grouped into buckets of at most
``bucket_bytes`` (a transfer larger than that is cut into row blocks first). Within a bucket,
large pieces travel as their own messages, with no copy on a side where they are contiguous; the
small ones are packed into one buffer. Round r of the executor moves bucket r of every link at
once (and overlaps it with round r+1; see executor.py for the memory bound this gives).
The executor runs exactly this list, so tests check the planned bytes against it without processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layout.realloc_plan import ReallocPlan, Transfer
from ..layout.shardmap import Slice, slice_numel


DIRECT_MIN_BYTES = 64 << 10  # below this, a message's latency costs more than packing it


@dataclass(frozen=True)
class Bucket:
    """Pieces that travel from ``src`` to ``dst`` in one round. A ``direct`` piece is large: it is its
    own message, sent from its place if it is contiguous in the source shard (else from a copy) and
    received into its place if it is contiguous in the destination shard (else into a buffer). The
    small pieces are packed, in order, into one message after them."""

    src: int
    dst: int
    pieces: tuple[Transfer, ...]
    direct: tuple[bool, ...]

    @property
    def packed(self) -> tuple[Transfer, ...]:
        return tuple(p for p, d in zip(self.pieces, self.direct, strict=True) if not d)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    @property
    def numel(self) -> int:
        return sum(slice_numel(p.region) for p in self.pieces)


def chop(region: Slice, max_elems: int) -> list[Slice]:
    """Cut a box into boxes of at most ``max_elems`` elements (at least one element each), by
    blocks of whole rows first so that pieces stay contiguous in a row-major source."""
    n = slice_numel(region)
    if n <= max_elems or len(region) == 0:
        return [region]
    (lo, hi), rest = region[0], region[1:]
    row = n // (hi - lo)
    if row <= max_elems or not rest:
        step = max(1, max_elems // row)
        return [((a, min(a + step, hi)),) + rest for a in range(lo, hi, step)]
    return [((a, a + 1),) + sub for a in range(lo, hi) for sub in chop(rest, max_elems)]


def _bucket(pieces: list[Transfer]) -> Bucket:
    direct = tuple(p.nbytes >= DIRECT_MIN_BYTES for p in pieces)
    return Bucket(pieces[0].src, pieces[0].dst, tuple(pieces), direct)


def link_buckets(plan: ReallocPlan, bucket_bytes: int) -> dict[tuple[int, int], list[Bucket]]:
    """Buckets of every (src, dst) link, in send order. ``bucket_bytes`` >= one element."""
    itemsize = plan.dtype_bytes
    max_elems = max(1, bucket_bytes // itemsize)
    out: dict[tuple[int, int], list[Bucket]] = {}
    open_: dict[tuple[int, int], tuple[list[Transfer], int]] = {}
    for t in plan.transfers:
        key = (t.src, t.dst)
        for region in chop(t.region, max_elems):
            piece = Transfer(t.name, t.src, t.dst, region, slice_numel(region) * itemsize)
            pieces, size = open_.get(key, ([], 0))
            if pieces and size + piece.nbytes > max_elems * itemsize:
                out.setdefault(key, []).append(_bucket(pieces))
                pieces, size = [], 0
            pieces.append(piece)
            open_[key] = (pieces, size + piece.nbytes)
    for key, (pieces, _) in open_.items():
        out.setdefault(key, []).append(_bucket(pieces))
    return out


Round = tuple[list[Bucket], list[Bucket]]


def rank_rounds(links: dict[tuple[int, int], list[Bucket]], rank: int) -> list[Round]:
    """Per round, the buckets ``rank`` sends and receives (peers in ascending order)."""
    sends = sorted((k, v) for k, v in links.items() if k[0] == rank)
    recvs = sorted((k, v) for k, v in links.items() if k[1] == rank)
    rounds = max([len(v) for _, v in sends + recvs], default=0)
    return [([v[r] for _, v in sends if r < len(v)], [v[r] for _, v in recvs if r < len(v)])
            for r in range(rounds)]
