"""Many ranks of torch's fake process group in one process, taking turns (for the dry run).

Each simulated rank has its own torch.distributed world (``init_process_group("fake", ...)``: every
collective returns at once and moves nothing), its own meshrl.parallel.comm state and its own
thread. Only one thread runs at a time: the one holding the *turn*. ``Turns.run`` starts every
rank's job and hands the turn round; a rank keeps it until its job ends or it must wait for a
message from another rank (``Turns.wait_for``: a batch part of a transfer step, ``Mailbox``), so
the ranks interleave exactly where the real runtime would have them wait on each other. When every
unfinished rank waits and nothing was posted since, the run would hang: ``Hang`` names who waits
for what.

Switching ranks swaps the module state that torch.distributed and comm keep per process
(``distributed_c10d._world``, which holds the default group; comm's group maps), so each rank sees
its own rank, groups and world. c10d's maps from a group to its ranks and name are the process's
(keyed by the group object, so the ranks' groups do not collide); one ``destroy_process_group``
at the end drops them all.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..parallel import comm
from torch.testing._internal.distributed.fake_pg import FakeStore


class Hang(RuntimeError):
    """Every unfinished rank waits for a message that no rank will send."""


@dataclass
class RankWorld:
    """One simulated rank's process-level state."""

    rank: int
    c10d_world: Any
    ctrl_of: dict = field(default_factory=dict)
    ctrl_ids: set = field(default_factory=set)
    state: dict = field(default_factory=dict)

    def activate(self) -> None:
        c10d._world = self.c10d_world
        comm._ctrl_of, comm._ctrl_ids, comm._state = self.ctrl_of, self.ctrl_ids, self.state


def make_world(rank: int, world_size: int) -> RankWorld:
    """A fake world of ``world_size`` ranks as rank ``rank`` sees it, with comm's control group."""

    rw = RankWorld(rank, c10d._World(), state={"world_ctrl": None, "device": None, "setup": False, "audit": None})
    rw.activate()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    comm.setup()
    return rw


class Turns:
    """Runs one job per rank in threads that take turns (see the module docstring)."""

    def __init__(self, worlds: dict[int, RankWorld]) -> None:
        self.worlds = worlds
        self.order = sorted(worlds)
        self.cv = threading.Condition()
        self.turn: int | None = None
        self.done: set[int] = set()
        self.waiting: dict[int, tuple[str, int]] = {}  # rank -> (what it waits for, posts seen)
        self.posts = 0  # messages posted so far: a waiting rank may go on only after a new one

    def _next(self, after: int) -> int | None:
        alive = [r for r in self.order if r not in self.done]
        if not alive:
            return None
        later = [r for r in alive if r > after]
        return (later or alive)[0]

    def _hand_on(self, rank: int) -> None:
        with self.cv:
            self.turn = self._next(rank)
            self.cv.notify_all()

    def _take(self, rank: int) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.turn == rank)
        self.worlds[rank].activate()

    def posted(self) -> None:
        self.posts += 1

    def wait_for(self, rank: int, ready: Callable[[], bool], what: str) -> None:
        """Give the turn away until ``ready()``; Hang when no rank can move any more."""
        while not ready():
            self.waiting[rank] = (what, self.posts)
            stuck = [r for r in self.order if r not in self.done]
            if all(r in self.waiting and self.waiting[r][1] == self.posts for r in stuck):
                lines = "; ".join(f"rank {r} waits for {self.waiting[r][0]}" for r in stuck)
                raise Hang(f"the ranks would hang: {lines}")
            self._hand_on(rank)
            self._take(rank)
        self.waiting.pop(rank, None)

    def run(self, jobs: dict[int, Callable[[], Any]], on_done: Callable[[int, int, int], None] | None = None
            ) -> tuple[dict[int, Any], dict[int, BaseException]]:
        """Every job on its rank's thread -> (results, errors) by rank. ``on_done(rank, finished,
        total)`` as each job ends (on its thread)."""
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}

        def main(rank: int) -> None:
            self._take(rank)
            try:
                results[rank] = jobs[rank]()
            except BaseException as e:  # noqa: BLE001 - reported by rank to the caller
                errors[rank] = e
            finally:
                self.done.add(rank)
                self.waiting.pop(rank, None)
                if on_done is not None:
                    on_done(rank, len(self.done), len(self.order))
                self.posted()  # a finished rank changes what the others may wait for
                self._hand_on(rank)

        threads = [threading.Thread(target=main, args=(r,), name=f"dry-rank{r}", daemon=True) for r in self.order]
        for t in threads:
            t.start()
        self._hand_on(-1)
        for t in threads:
            t.join()
        return results, errors


class Mailbox:
    """Batch parts of transfer steps between simulated ranks (runtime/transfer.py posts and takes
    them in a dry run): FIFO per (sender, receiver), as the real messages are matched, each tagged
    with the step it was sent in (``step_of(rank)``: the step a rank is in)."""

    def __init__(self, turns: Turns, step_of: Callable[[int], str], stand_in: Callable[[int], int] | None = None
                 ) -> None:
        self.turns, self.step_of = turns, step_of
        self.queues: dict[tuple[int, int], deque] = defaultdict(deque)
        # a sender that is not simulated (symmetry): the rank whose parts stand for its
        self.stand_in = stand_in or (lambda r: r)

    def post(self, src: int, dst: int, part: Any) -> None:
        self.queues[(src, dst)].append((self.step_of(src), part))
        self.turns.posted()

    def take(self, src: int, dst: int) -> Any:
        step = self.step_of(dst)
        real = self.stand_in(src)
        if real != src:  # src is not simulated: a part its stand-in sent in this step, to anyone
            def sent() -> list:
                return [p for (s, _), q in self.queues.items() if s == real for st, p in q if st == step]
            self.turns.wait_for(dst, lambda: bool(sent()), f"a batch part from rank {real} (standing in for {src})")
            return sent()[0]
        key = (src, dst)
        self.turns.wait_for(dst, lambda: bool(self.queues[key]), f"a batch part from rank {src} in step '{step}'")
        sent_in, part = self.queues[key].popleft()
        if sent_in != step:
            raise RuntimeError(f"rank {dst} in step '{step}' received the batch part rank {src} sent in step "
                               f"'{sent_in}': the two ranks disagree on the order of transfer steps")
        return part

    def unread(self) -> list[tuple[int, int, int]]:
        """(sender, receiver, parts) never taken although both are simulated."""
        return [(s, d, len(q)) for (s, d), q in self.queues.items() if q and d in self.turns.worlds]
