"""Async generation's state across a checkpoint (``train.off_policy=k``): the generations of
iterations t+1 .. t+k run before the end of iteration t, so the checkpoint after t holds what they
left on each rank (docs/runtime.md, "Exact resume with train.off_policy"), and a resume, under the
same plan or another one, puts it back."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ..algo.batch import Batch
from ..algo.registry import tensor_keys
from ..plan.steps import generated_ahead
from .checkpoint import save_checkpoint
from .engine import Engine, RankLog


def save_after(engine: Engine, out: str | Path, t: int, timeout_s: float,
               hook: Callable[[str, int], None] | None = None) -> None:
    """Collective: the checkpoint after iteration t, with what the generations of later iterations
    left here when they ran ahead (async generation): {iteration: state}."""
    cfg = engine.cfg
    early = generated_ahead(cfg.train.off_policy, t, cfg.train.iterations)
    save_checkpoint(out, t, engine.roles, engine.plan.to_json(),
                    ahead={j: ahead_state(engine, j) for j in early} if early else None, timeout_s=timeout_s, hook=hook)


def ahead_state(engine: Engine, t: int) -> dict:
    """What iteration t's generation, run ahead of time (async), left on this rank: the output rows
    of every call of t it holds ({call: {"data", "index"}}) and the rank's log of t so far."""

    held = {name: {"data": b.data, "index": b.index} for (name, it), b in engine.held.items() if it == t}
    log = engine.logs.get(t)
    return {"held": held, "log": dataclasses.asdict(log) if log is not None else None}


def restore_ahead(engine: Engine, early: dict, start: int) -> int:
    """Put back what ``save_after`` saved, as if the generations of those iterations had just run
    here; returns how many iterations from ``start`` on it restored. ``early``
    (checkpoint.load_checkpoint): this rank's saved states under the plan they were saved with;
    under another plan or world, every saved rank's, resharded here (``_restore_resharded``)."""
    iterations = sorted(early["iterations"])
    if iterations != list(range(start, start + len(iterations))):
        raise RuntimeError(f"the checkpoint's generations ran ahead for iterations {iterations}, not from {start} on")
    for t in iterations:
        if early["same"]:
            _restore_own(engine, early["states"][0][t], t)
        else:
            _restore_resharded(engine, [s[t] for s in early["states"]], t)
    return len(iterations)


def _restore_own(engine: Engine, state: dict, t: int) -> None:
    for name, b in state["held"].items():
        engine.held[(name, t)] = Batch(b["data"], b["index"])
    if state["log"] is not None:
        engine.logs[t] = RankLog(**state["log"])


def _restore_resharded(engine: Engine, states: list[dict], t: int) -> None:
    """Every saved rank's state of iteration t: each call's output rows are merged (they carry their
    row index) and the holder of each dp replica under this plan takes its replica's rows, split as
    the call itself splits its input batch; a streamed generation's rows in flight go to every rank
    of the replica (runtime/stream.py), and come from every rank that saved them (duplicates dropped)."""
    parts: dict[str, list[Batch]] = {}
    for state in states:
        for name, b in state["held"].items():
            parts.setdefault(name, []).append(Batch(b["data"], b["index"]))
    for name, got in parts.items():
        merged = Batch.merge(_distinct(got)) if got[0].index is not None else got[0]
        pl = engine.plan.calls[name].placement
        if engine.rank not in pl.mesh:
            continue
        dp_i = pl.coords_of(engine.rank)[0]
        streamed = (engine.cfg.stream_steps_at(engine.cfg.train.off_policy) > 0
                    and engine.graph.call(name).kind == "generate")
        if streamed or engine.rank == pl.holders()[dp_i]:
            inputs = engine._batch(t).only(tensor_keys(engine.graph.call(name).inputs))
            engine.held[(name, t)] = merged.select(inputs.split(pl.layout.dp)[dp_i].index)
    mine = states[engine.rank]["log"] if engine.rank < len(states) else None
    if mine is not None:  # its timings only: they are the saved ranks', not this plan's
        engine.logs[t] = RankLog(**mine)


def _distinct(parts: list[Batch]) -> list[Batch]:
    """``parts`` with each row index kept once (the first part that has it): the ranks of one
    replica saved the same rows."""
    seen: set[int] = set()
    out = []
    for p in parts:
        keep = [i for i, r in enumerate(p.index.tolist()) if r not in seen]
        seen.update(p.index[keep].tolist())
        if keep:
            out.append(Batch({k: v[keep] for k, v in p.data.items()}, p.index[keep]))
    return out
