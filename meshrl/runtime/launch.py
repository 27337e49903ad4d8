"""Start local ranks as processes with a real process group, and run functions on all of them.

``RankPool`` starts N processes once (gloo on CPU, NCCL on GPUs), each with an initialised default
process group, and then runs any number of functions on all ranks: a test module starts one pool
and shares it across its tests, so the suite pays the start-up cost once. Every wait has a
deadline: a rank that raises, dies or hangs ends the whole pool with an error naming the rank,
and no process is left behind.

Functions sent to the pool must be importable (module level) so that they pickle by reference;
``run`` pickles every task before sending it, so one that cannot be sent fails at once, named.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..cores import quiet_waits, rank_threads
from ..errors import UserError
from ..host_memory import freed_memory_env, keep_freed_memory
import threading
from multiprocessing.reduction import ForkingPickler
import pickle


class RankError(RuntimeError):
    """A rank raised, died or timed out; the message names the rank and what it was doing."""


@dataclass
class _Task:
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict


def _exit_with_parent(parent: int) -> None:
    """A rank whose parent is gone (e.g. the job was killed with SIGKILL) exits instead of running on."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _worker(rank: int, world: int, init_file: str, backend: str, coll_timeout: float,
            tasks: "mp.Queue", results: "mp.Queue", env: dict[str, str]) -> None:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    os.environ.update(env)
    keep_freed_memory()  # glibc read MALLOC_* at the start, before os.environ had them
    import torch  # in a rank after its environment is set: torch reads OMP_* as it loads
    import torch.distributed as dist  # in a rank after its environment is set: torch reads OMP_* as it loads

    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    try:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=coll_timeout))
    except Exception:  # noqa: BLE001 - reported to the parent, which names the rank
        results.put((rank, "error", traceback.format_exc()))
        return
    from .run import end_world  # in a rank after its environment is set: torch reads OMP_* as it loads
    from ..parallel import comm  # in a rank after its environment is set: torch reads OMP_* as it loads

    comm.setup(datetime.timedelta(seconds=coll_timeout))  # the world's control (gloo) group
    results.put((rank, "ready", None))

    while True:
        raw = tasks.get()
        if raw is None:
            break
        try:  # unpickling the task imports its module: an import error is this rank's error too
            task = ForkingPickler.loads(raw)
        except Exception:  # noqa: BLE001
            results.put((rank, "error", traceback.format_exc()))
            continue
        try:
            out = task.fn(*task.args, **task.kwargs)
            results.put((rank, "ok", out))
        except Exception:  # noqa: BLE001
            results.put((rank, "error", traceback.format_exc()))
    end_world()


def _pickled(task: _Task) -> bytes:
    """The task as the queue would pickle it (ForkingPickler: tensors go by shared memory), pickled
    here so that a function or argument that cannot be sent fails at once, named (the queue would
    pickle it in a background thread, print the error there, and leave the ranks waiting for
    ever). One pickle per rank: a tensor's shared-memory handle can be received only once."""

    try:
        return bytes(ForkingPickler.dumps(task))
    except Exception as e:  # noqa: BLE001 - any pickling failure; find the culprit below
        parts = [("the function", task.fn)] + [(f"argument {i}", a) for i, a in enumerate(task.args)] + \
            [(f"keyword argument {k!r}", v) for k, v in task.kwargs.items()]
        culprit = next((name for name, x in parts if not _picklable(x)), "the task")
        what = getattr(task.fn, "__qualname__", repr(task.fn))
        raise UserError(f"RankPool.run({what}): {culprit} cannot be sent to the ranks "
                        f"({type(e).__name__}: {e}); functions must be defined at module level, "
                        "and arguments must pickle (no lambdas, local functions, open files or locks)") from None


def _picklable(x: Any) -> bool:
    try:
        pickle.dumps(x)
        return True
    except Exception:  # noqa: BLE001
        return False


class RankPool:
    """N local ranks with a default process group. Use as a context manager or call close()."""

    def __init__(self, nprocs: int, backend: str | None = None, timeout: float = 120.0,
                 start_timeout: float = 120.0, env: dict[str, str] | None = None) -> None:
        if nprocs < 1:
            raise UserError(f"nprocs must be >= 1, got {nprocs}")
        import torch  # lazy: spawned ranks import this module before their environment is set

        self.nprocs = nprocs
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.timeout = timeout
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="meshrl-pool-")
        init_file = os.path.join(self._dir.name, "rendezvous")
        self._tasks = [ctx.Queue() for _ in range(nprocs)]
        self._results: mp.Queue = ctx.Queue()
        # No THP_MEM_ALLOC_ENABLE=1 by default: huge pages make a fresh reallocated copy slower
        # (measured side by side: docs/realloc.md "Making the fresh copy fast").
        # Each rank's torch threads: $OMP_NUM_THREADS if set, else the usable cores split between the
        # ranks (meshrl/cores.py); set in the rank's environment before it imports torch.
        child_env = {"OMP_NUM_THREADS": str(rank_threads(0, nprocs)[0]), **quiet_waits(dict(os.environ)),
                     **freed_memory_env(),
                     **(env or {})}
        self._procs = [
            ctx.Process(target=_worker, daemon=True, name=f"meshrl-rank{r}",
                        args=(r, nprocs, init_file, self.backend, timeout, self._tasks[r], self._results,
                              child_env))
            for r in range(nprocs)
        ]
        for p in self._procs:
            p.start()
        self._collect("ready", "starting the process group", start_timeout)

    def _collect(self, expect: str, what: str, timeout: float) -> list[Any]:
        out: list[Any] = [None] * self.nprocs
        pending = set(range(self.nprocs))
        deadline = time.monotonic() + timeout
        while pending:
            try:
                rank, status, payload = self._results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r in pending if not self._procs[r].is_alive()]
                if dead:
                    codes = {r: self._procs[r].exitcode for r in dead}
                    self.close(force=True)
                    raise RankError(f"rank(s) {dead} died while {what} (exit codes {codes})") from None
                if time.monotonic() > deadline:
                    self.close(force=True)
                    raise RankError(
                        f"rank(s) {sorted(pending)} did not finish {what} within {timeout:.0f} s"
                    ) from None
                continue
            if status == "error":
                self.close(force=True)
                raise RankError(f"rank {rank} failed while {what}:\n{payload}")
            out[rank] = payload
            pending.discard(rank)
        return out

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Run fn(*args, **kwargs) on every rank; return the per-rank results in rank order."""
        if not self._procs:
            raise RankError("the rank pool is closed")
        raws = [_pickled(_Task(fn, args, kwargs)) for _ in self._tasks]  # all before any is sent
        for q, raw in zip(self._tasks, raws, strict=True):
            q.put(raw)
        return self._collect("ok", f"running {getattr(fn, '__name__', fn)}", timeout or self.timeout)

    def close(self, force: bool = False) -> None:
        if not self._procs:
            return
        if not force:
            for q in self._tasks:
                q.put(None)
            deadline = time.monotonic() + 10  # one deadline for all ranks, not 10 s each
            for p in self._procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []
        self._dir.cleanup()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(force=exc[0] is not None)

    def __del__(self) -> None:
        try:
            self.close(force=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def spawn(fn: Callable[..., Any], nprocs: int, *args: Any, timeout: float = 120.0, **kwargs: Any) -> list[Any]:
    """One-shot: start ``nprocs`` ranks, run fn on all, shut down. Returns per-rank results."""
    with RankPool(nprocs, timeout=timeout) as pool:
        return pool.run(fn, *args, **kwargs)


def failure_report(status_dir: Path, err: Exception) -> str:
    """The pool's error plus what every rank was doing when the job ended."""
    lines = [str(err).splitlines()[0] if str(err) else type(err).__name__]
    for f in sorted(status_dir.glob("rank*"), key=lambda p: int(p.name[4:])):
        text = f.read_text().strip()
        lines.append(f"  {f.name}: {text.splitlines()[0] if text else '(no step yet)'}")
        if text.startswith("failed"):
            lines.append("    " + text.splitlines()[-1])
    return "\n".join(lines)
