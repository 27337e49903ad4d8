"""``meshrl train --nprocs N --plan STRATEGY|FILE.json [--resume]``: one job of N ranks running a plan.

Locally the job starts its ranks itself (meshrl/runtime/launch.py: gloo on CPU, NCCL on GPUs);
under ``torchrun`` (RANK / WORLD_SIZE / MASTER_ADDR in the environment) each torchrun process is
one rank and joins the env:// rendezvous. Everything a user can get wrong is checked before any
rank starts. A rank that raises or dies ends the job at once, a rank that hangs ends it when the
collective timeout expires, and the message names the rank and the step (call, reallocation or
transfer) it was in: each rank writes its current step to ``OUT/.ranks/rankN``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..config import Config, dump_yaml
from ..errors import UserError
from ..plan.execution_plan import ExecutionPlan
from .plans import plan_table, resolve_compile, resolve_run, with_compile
from ..cores import rank_threads
from .checkpoint import check_format, latest_checkpoint
from ..plan.lag import with_lag
import yaml
from .launch import RankError, RankPool, failure_report
from .run import end_world, rank_main
import datetime
import torch
import torch.distributed as dist
from ..parallel import comm

JOB_DEADLINE_S = 7 * 24 * 3600.0  # the pool's wait for the whole run; hangs are bounded by timeout_s


def threads_per_rank(cfg: Config, local_ranks: int) -> tuple[int, str]:
    """(torch threads each rank gets, why): ``train.threads``, or auto (meshrl/cores.py)."""

    return rank_threads(cfg.train.threads, local_ranks)


def local_ranks(world: int) -> int:
    """Ranks of this job on this machine: torchrun's LOCAL_WORLD_SIZE, else the job's ranks."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else world


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def prepare(cfg: Config, plan_spec: str, world: int, out: Path, resume: bool, quiet: bool
            ) -> tuple[ExecutionPlan, int, Config]:
    """The plan the ranks run, the first iteration (after the newest checkpoint with ``resume``)
    and the config they run (``train.off_policy=auto`` resolved: the lag chosen with the plan, or on
    a resume the lag the run chose, read from OUT/config.yaml; so ``train.compile`` / ``gen.compile``
    = auto, printing the choice); writes OUT/plan.json (and, when anything was chosen,
    OUT/config.yaml with it) and prints the plan table. Runs once per job: in the
    launching process, or on rank 0 under torchrun once the process group exists (its result is
    broadcast)."""

    start = 0
    ck = latest_checkpoint(out) if resume else None
    saved = None
    if ck is not None:
        check_format(ck)  # an older meshrl's per-rank checkpoint: a UserError naming it
        saved = ExecutionPlan.load(ck / "plan.json")
    chose = cfg.train.off_policy == "auto"
    if chose and resume and (k := saved_lag(out)) is not None:
        cfg, chose = with_lag(cfg, k), False  # the lag the run chose at its start: it changes the numbers
    if saved is not None and plan_spec == "search" and saved.cluster.size == world:
        # the plan the run was searched (or re-planned) into: searching again may find another (its
        # time budget), which would resume correctly (checkpoints reshard) but not bit for bit
        if chose:  # (a run chose its lag before its first checkpoint and wrote it down)
            raise UserError(f"--resume: {out}/config.yaml does not say which lag the run chose under "
                            "train.off_policy=auto; give it as train.off_policy=K")
        plan, note = saved, "--plan search: resuming under the plan saved with the checkpoint"
    else:
        cfg, plan, note = resolve_run(cfg, plan_spec, world)
    compiled = "auto" in (cfg.train.compile, cfg.gen.compile)
    if compiled and resume and (kept := saved_compile(out)) is not None:
        cfg, compiled = with_compile(cfg, *kept), False  # as the run chose at its start: it changes the rounding
    if compiled:
        cfg, line = resolve_compile(cfg, plan, world)
        if not quiet:
            print(line)
    if chose or compiled:
        (out / "config.yaml").parent.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(dump_yaml(cfg))
    if resume and ck is None and not quiet:
        # killed before its first checkpoint (in the warm-up, say): the same command starts over
        print(f"--resume: no checkpoint in {out} yet, so the run starts from the beginning")
    if ck is not None:
        start = int(ck.name.split("-")[1]) + 1
        if start >= cfg.train.iterations and not quiet:
            # a job killed after its last checkpoint: the same command + --resume ends as it would have
            print(f"--resume: {out} already holds all {start} iterations (raise train.iterations to train on)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(plan.to_json())
    if not quiet and (world > 1 or plan_spec != "colocated"):  # one rank by default: nothing to choose
        print(plan_table(plan, cfg.train.off_policy) + (f"\n{note}" if note else ""))
    if not quiet and start:
        print(f"resuming from {latest_checkpoint(out)} at iteration {start}")
    return plan, start, cfg


def _saved(out: Path, section: str, key: str):
    """OUT/config.yaml's ``section.key`` (what a run with an auto setting chose when it started), or
    None where the file, the section or the key is missing or unreadable."""
    try:
        saved = yaml.safe_load((out / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    part = saved.get(section) if isinstance(saved, dict) else None
    return part.get(key) if isinstance(part, dict) else None


def saved_compile(out: Path) -> tuple[bool, bool] | None:
    """(train.compile, gen.compile) recorded in OUT/config.yaml if both are true or false, else None."""
    got = (_saved(out, "train", "compile"), _saved(out, "gen", "compile"))
    return got if all(isinstance(v, bool) for v in got) else None


def saved_lag(out: Path) -> int | None:
    """The ``train.off_policy`` recorded in OUT/config.yaml if it is a number, else None."""
    k = _saved(out, "train", "off_policy")
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 0 else None


def launch(cfg: Config, plan_spec: str, nprocs: int, out: Path, resume: bool = False,
           timeout_s: float | None = None, quiet: bool = False, progress: bool = False) -> list[dict] | None:
    """Run the job; returns rank 0's metrics records. Raises UserError for bad input and
    RuntimeError (naming rank and step) when a rank fails. ``timeout_s``: how long any rank waits
    for another (default: the config's ``train.timeout``). One rank runs in this process."""
    timeout_s = cfg.train.timeout if timeout_s is None else timeout_s
    if not timeout_s > 0:
        raise UserError(f"train.timeout must be > 0 seconds, got {timeout_s}")
    if under_torchrun():
        quiet = quiet or os.environ["RANK"] != "0"  # one console: global rank 0
        return _torchrun_main(cfg, plan_spec, out, resume, timeout_s, quiet, progress)
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise UserError(f"--nprocs must be a whole number >= 1, got {nprocs}")
    plan, start, cfg = prepare(cfg, plan_spec, nprocs, out, resume, quiet)
    status = out / ".ranks"
    shutil.rmtree(status, ignore_errors=True)
    status.mkdir()
    if nprocs == 1:
        return in_process(cfg, plan, str(out), start, timeout_s, status, quiet, progress)

    try:
        threads = threads_per_rank(cfg, nprocs)[0]  # set in each rank before it imports torch
        with RankPool(nprocs, timeout=timeout_s, env={"OMP_NUM_THREADS": str(threads)}) as pool:
            return pool.run(rank_main, cfg, plan, str(out), start, timeout_s, str(status), quiet,
                            cfg.train.save_every, progress, timeout=JOB_DEADLINE_S)[0]
    except RankError as e:
        raise RuntimeError(failure_report(status, e)) from None


def in_process(cfg: Config, plan: ExecutionPlan, out: str | None, start: int = 0, timeout_s: float = 300.0,
               status: Path | None = None, quiet: bool = True, progress: bool = False) -> list[dict] | None:
    """One rank, here: a world of one (gloo on CPU, NCCL on a GPU) over an in-memory store, so a
    one-device run is the same runtime as any other, without a process to spawn."""

    if dist.is_initialized():
        raise UserError("meshrl train: torch.distributed is already initialised in this process; "
                        "run one job at a time")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)
    before = torch.get_num_threads()  # the caller's, given back at the end (a library call, a test)
    torch.set_num_threads(threads_per_rank(cfg, 1)[0])
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        return rank_main(cfg, plan, out, start, timeout_s, str(status) if status else None, quiet,
                         cfg.train.save_every, progress)
    finally:
        end_world()
        torch.set_num_threads(before)


def _torchrun_main(cfg: Config, plan_spec: str, out: Path, resume: bool, timeout_s: float, quiet: bool,
                   progress: bool) -> list[dict] | None:
    """One torchrun process = one rank. The process group comes first; then rank 0 alone resolves
    the plan (a strategy, or a search whose result may depend on its time budget) and checks the
    checkpoint, and broadcasts both: every rank runs what rank 0 chose. A UserError on rank 0
    reaches every rank as the same UserError."""

    torch.set_num_threads(threads_per_rank(cfg, local_ranks(1))[0])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))

    comm.setup(datetime.timedelta(seconds=timeout_s))
    try:
        box: list = [None]
        if dist.get_rank() == 0:
            try:
                plan, start, cfg = prepare(cfg, plan_spec, dist.get_world_size(), out, resume, quiet)
                box[0] = (plan.to_json(), start, cfg.train.off_policy, (cfg.train.compile, cfg.gen.compile), None)
            except UserError as e:
                box[0] = (None, 0, 0, (False, False), str(e))
        box[0] = comm.broadcast_object(box[0], 0, comm.control(None))  # an object: the control plane
        plan_json, start, lag, compiled, error = box[0]
        if error is not None:
            raise UserError(error)
        cfg = with_compile(with_lag(cfg, lag), *compiled)  # rank 0's choices under auto
        return rank_main(cfg, ExecutionPlan.from_json(plan_json), str(out), start, timeout_s, None, quiet,
                         cfg.train.save_every, progress)
    finally:
        end_world()
