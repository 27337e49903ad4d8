"""trace.json grows by appending (meshrl/observe/trace.py): every save leaves a valid Chrome trace
with all events so far, in order, ``ts`` from the first save's earliest event; what was written
stays byte for byte (only the closing tail is rewritten); another path starts a new file."""

import json

from meshrl.observe.trace import TAIL, Trace


def _events(path):
    return [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]


def test_saves_append(tmp_path):
    path = tmp_path / "trace.json"
    tr = Trace(2, "t")
    tr.add(0, "a", "call", 100.0, 0.5, 0)
    tr.add(1, "b", "call", 100.25, 0.25, 0)
    tr.save(path)
    first = path.read_bytes()
    names = ["a", "b"]
    for it in range(1, 4):
        tr.add(0, f"c{it}", "call", 100.0 + it, 0.1, it)
        tr.add(1, f"d{it}", "transfer", 100.5 + it, 0.1, it)
        tr.save(path)
        names += [f"c{it}", f"d{it}"]
        now = path.read_bytes()
        assert now.startswith(first[: -len(TAIL)])  # nothing already written was rewritten
        evs = _events(path)
        assert [e["name"] for e in evs] == names
        assert evs[-1]["ts"] == (0.5 + it) * 1e6 and evs[-1]["args"] == {"iteration": it}
    meta = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "M"]
    assert [m["args"]["name"] for m in meta] == ["t", "rank 0", "rank 1"]
    assert tr.events == []  # saved events are not kept in memory
    tr.save(path)  # nothing new: unchanged
    assert path.read_bytes() == now


def test_another_path_or_a_changed_file_starts_afresh(tmp_path):
    tr = Trace(1)
    tr.add(0, "a", "call", 1.0, 0.1, 0)
    tr.save(tmp_path / "one.json")
    tr.add(0, "b", "call", 2.0, 0.1, 1)
    tr.save(tmp_path / "two.json")
    assert [e["name"] for e in _events(tmp_path / "two.json")] == ["b"]
    (tmp_path / "two.json").write_text('{"traceEvents": []}')  # someone replaced it
    tr.add(0, "c", "call", 3.0, 0.1, 2)
    tr.save(tmp_path / "two.json")
    assert [e["name"] for e in _events(tmp_path / "two.json")] == ["c"]
