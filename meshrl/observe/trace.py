"""trace.json in the Chrome trace format (viewable in Perfetto or chrome://tracing): one track per rank.

Events are complete events (``"ph": "X"``) with wall-clock start times taken by each rank with
``time.time()``: the ranks of one machine share that clock, so their tracks line up.
"""

from __future__ import annotations

import json
from pathlib import Path


class Trace:
    """Collects (rank, name, kind, start_s, duration_s, iteration) and writes trace.json."""

    def __init__(self, world: int, title: str = "meshrl run") -> None:
        self.world, self.title = world, title
        self.events: list[dict] = []

    def add(self, rank: int, name: str, kind: str, start_s: float, dur_s: float, iteration: int) -> None:
        self.events.append({"ph": "X", "name": name, "cat": kind, "pid": 0, "tid": rank, "start": start_s,
                            "dur": dur_s * 1e6, "args": {"iteration": iteration}})

    def to_dict(self) -> dict:
        """{"traceEvents": [...]}: metadata naming the process and one thread per rank, then the
        events with ``ts`` in microseconds since the earliest event."""
        t0 = min((e["start"] for e in self.events), default=0.0)
        evs: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": self.title}}]
        evs += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
                for r in range(self.world)]
        for e in self.events:
            ev = {k: v for k, v in e.items() if k != "start"}
            ev["ts"] = (e["start"] - t0) * 1e6
            evs.append(ev)
        return {"traceEvents": evs, "displayTimeUnit": "ms"}

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file, then rename), so a reader never sees half a trace."""
        p = Path(path)
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict()))
        tmp.replace(p)
