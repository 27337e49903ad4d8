"""Fault injection for the tests that kill or hang one rank (tests/commands/test_kill_one_rank.py,
tests/runtime/test_job.py, test_reshard.py, test_resume.py): a hook that the engine calls as a
rank enters each step, and that a checkpoint save calls between a rank's files and the commit.

The tests ask for it through the environment, because they run ``meshrl train`` in subprocesses:
``MESHRL_FAULT="RANK:NAME"`` kills rank RANK (exit code 3) when it enters the first step named
NAME (e.g. ``"1:actor_gen"``; ``"1:checkpoint"`` is the save); ``"RANK:NAME:hang"`` makes it hang
there instead (alive, sleeping), which the other ranks' timeouts must end; ``"RANK:NAME@T"`` does
it in iteration T only. Without the variable no hook is installed (``from_env`` gives None), so a
run pays nothing for it. ``runtime/run.py`` is the one place that installs it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class Fault:
    """Kill (or hang) ``rank`` when it enters the step ``name`` (of ``iteration``, if given)."""

    rank: int
    name: str
    iteration: int | None
    hang: bool
    status: Path | None  # the rank's status file (the launcher names the step from it)

    def __call__(self, name: str, iteration: int) -> None:
        if name != self.name or (self.iteration is not None and iteration != self.iteration):
            return
        if self.status is not None:
            self.status.write_text(f"step '{name}' of iteration {iteration} "
                                   f"({'hung' if self.hang else 'killed'} by MESHRL_FAULT at {time.time():.3f})")
        while self.hang:
            time.sleep(1.0)
        os._exit(3)


def from_env(rank: int, status: Path | None) -> Fault | None:
    """This rank's fault from ``MESHRL_FAULT`` (None: not set, or meant for another rank)."""
    spec = os.environ.get("MESHRL_FAULT", "")
    who, _, what = spec.partition(":")
    if not what or who != str(rank):
        return None
    hang = what.endswith(":hang")
    name, _, when = (what[:-len(":hang")] if hang else what).partition("@")
    return Fault(rank, name, int(when) if when else None, hang, status)
