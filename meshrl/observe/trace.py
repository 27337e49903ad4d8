"""trace.json in the Chrome trace format (viewable in Perfetto or chrome://tracing): one track per rank.

Events are complete events (``"ph": "X"``) with wall-clock start times taken by each rank with
``time.time()``: the ranks of one machine share that clock, so their tracks line up.

The file grows by appending: each ``save`` writes only the events added since the last one, over
the closing ``]}`` it then writes again, so a run's trace costs O(events) to write in all (it used
to be rewritten whole every iteration: O(iterations x events), gigabytes for a long run on many
ranks). The first save of a file writes it whole, atomically (temp file, then rename). An append
that dies half-way leaves the file without its closing bracket; Perfetto and chrome://tracing read
such a file (the trace format lets a JSON array end unterminated), json.loads does not.
"""

from __future__ import annotations

import json
from pathlib import Path

TAIL = b'\n], "displayTimeUnit": "ms"}\n'


class Trace:
    """Collects (rank, name, kind, start_s, duration_s, iteration) and writes trace.json."""

    def __init__(self, world: int, title: str = "meshrl run") -> None:
        self.world, self.title = world, title
        self.events: list[dict] = []  # added since the last save
        self._t0: float | None = None  # ts 0: the earliest event of the first save
        self._path: Path | None = None  # the file the saved events are in
        self._tail_at = 0  # byte offset of TAIL in it

    def add(self, rank: int, name: str, kind: str, start_s: float, dur_s: float, iteration: int) -> None:
        self.events.append({"ph": "X", "name": name, "cat": kind, "pid": 0, "tid": rank, "start": start_s,
                            "dur": dur_s * 1e6, "args": {"iteration": iteration}})

    def _lines(self) -> list[bytes]:
        """The unsaved events as JSON lines, ``ts`` in microseconds since ``_t0``."""
        if self._t0 is None:
            self._t0 = min((e["start"] for e in self.events), default=0.0)
        out = []
        for e in self.events:
            ev = {k: v for k, v in e.items() if k != "start"}
            ev["ts"] = (e["start"] - self._t0) * 1e6
            out.append(json.dumps(ev).encode())
        return out

    def save(self, path: str | Path) -> None:
        """Write the events added since the last save: the whole file the first time (or when
        ``path`` is another file, or it changed under us), else appended before the closing tail."""
        p = Path(path)
        fresh = p != self._path or not p.exists() or p.stat().st_size != self._tail_at + len(TAIL)
        if fresh:
            meta = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": self.title}}]
            meta += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
                     for r in range(self.world)]
            body = b'{"traceEvents": [\n' + b",\n".join([json.dumps(m).encode() for m in meta] + self._lines())
            tmp = p.with_suffix(".json.tmp")
            tmp.write_bytes(body + TAIL)
            tmp.replace(p)
            self._path, self._tail_at = p, len(body)
        elif self.events:
            chunk = b",\n" + b",\n".join(self._lines())
            with p.open("r+b") as f:
                f.seek(self._tail_at)
                f.write(chunk + TAIL)
            self._tail_at += len(chunk)
        self.events.clear()
