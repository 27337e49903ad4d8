"""``meshrl plan ... --dry-run``: one iteration of the real runtime at full size, on fake tensors and
torch's fake process group, on this one CPU.

Every simulated rank (fake_world.py: its own fake world and thread, taking turns) builds the real
``Engine`` for the plan (the same roles, ParallelModels, optimizer, reallocators and step walk as
``meshrl train``) inside a ``FakeTensorMode`` (shapes, dtypes, no storage) and runs iteration 0
with meshrl.model.worst_case on: every response runs to ``data.gen_len``, no padding is removed,
min(k, experts held) MoE experts of each layer get every token. What it measures (fake_exec.py, collective_audit.py):

- per step and rank: the bytes live at the step's peak (parameters, gradients, optimizer state,
  copies, activations, buffers: every storage an op made and has not freed), next to the
  estimator's prediction for that call and rank (Problem.rank_call_memory);
- every communication call through meshrl.parallel.comm, audited across each group's members;
- *no whole model*: a model (built, or rebuilt by a reallocation) that holds whole a weight its
  layout shards over tp, and a call that allocates logits of whole sequences over the whole
  vocabulary on a tp > 1 rank, fail the run with the tensor's name and size (``Violation``).

Left out, on purpose: the SFT warm-up, evaluations, checkpoints, metrics and the trace (nothing is
written), and everything GPU-only (fake CUDA tensors need a CUDA build: the device code runs as
fake CPU tensors of the configured dtype; see docs/dry_run.md).
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass, field

from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed import distributed_c10d as c10d

from ..config import Config
from ..cpu_features import auto_dtype
from ..errors import UserError
from ..model.config import param_shapes
from ..plan.execution_plan import ExecutionPlan
from ..plan.steps import Step
from ..model.worst_case import worst_case
from ..parallel import comm
from ..parallel.groups import GroupCache
from . import transfer
from .collective_audit import RankLedger, audit
from .engine import Engine
from .fake_exec import Alloc, FakeRank, fast_tolist
from .fake_world import Hang, Mailbox, Turns, make_world
from .run import make_groups, model_configs, plan_groups
from .symmetry import Classes, classes, compare_members

TIMEOUT_S = 3600.0


def sharded_weights(mcfg, value: bool) -> dict[str, tuple[int, ...]]:
    """The 2-D weights a tp > 1 layout never holds whole on one rank (name -> full shape): all but
    the value head, the MoE router and experts (whole experts are spread over tp) and, with one KV
    head, the k/v projections; 1-D tensors (norms, biases) are replicated by design."""
    out = {}
    for name, shape in param_shapes(mcfg, value).items():
        router = name.endswith(f".{mcfg.moe_prefix}.gate.weight")
        if len(shape) != 2 or name == "score.weight" or ".experts." in name or router:
            continue
        if mcfg.num_key_value_heads == 1 and (".k_proj." in name or ".v_proj." in name):
            continue
        out[name] = tuple(shape)
    return out


@dataclass
class StepMemory:
    """One step on one rank: kind, call, bytes live at its start and at its peak."""

    name: str
    kind: str
    call: str
    start: int
    peak: int
    top: list[Alloc] = field(default_factory=list)


@dataclass
class Violation:
    """A whole weight or a full-vocabulary tensor where a layout shards it."""

    rank: int
    step: str
    what: str
    nbytes: int

    def message(self) -> str:
        return f"rank {self.rank}, step '{self.step}': {self.what} ({self.nbytes / 2**20:.1f} MiB)"


@dataclass
class RankRun:
    """What one simulated rank did."""

    rank: int
    built: int = 0  # bytes live after building the engine (weights, master copies)
    steps: list[StepMemory] = field(default_factory=list)
    ledger: RankLedger | None = None
    violations: list[Violation] = field(default_factory=list)
    placeholders: int = 0  # values read to Python (meaningless in a dry run)
    seen: set = field(default_factory=set)  # models checked for whole weights


def dry_config(cfg: Config) -> Config:
    """The config a dry run executes: one iteration, no SFT warm-up, no evaluation file, nothing
    compiled, and ``train.dtype=auto`` as the cluster's devices take it (bf16 on a GPU; on a CPU
    cluster as this CPU takes it: meshrl/cpu_features.py)."""
    cfg = copy.deepcopy(cfg)
    cfg.train.iterations = 1
    cfg.sft.warmup = False
    cfg.eval.path = None
    cfg.train.compile = False
    cfg.gen.compile = False
    if cfg.train.dtype == "auto":
        cfg.train.dtype = auto_dtype(gpu=cfg.cluster.device != "cpu")
    return cfg


class _Guard:
    """The per-step full-vocabulary check (``FakeRank.check``) for one rank."""

    def __init__(self, plan: ExecutionPlan, run: RankRun) -> None:
        self.plan, self.run = plan, run
        self.step = ""
        self.vocab_size: int | None = None

    def enter(self, step: Step, roles: dict) -> None:
        """Arm the check for ``step``: a call of a language model whose layout shards the vocabulary."""
        self.step = f"{step.name} (iteration {step.iteration})"
        self.vocab_size = None
        rm = roles.get(step.role)
        if step.kind != "call" or rm is None or rm.cfg is None or step.role in ("critic", "reward"):
            return
        if self.plan.calls[step.call].placement.layout.tp > 1:
            self.vocab_size = rm.cfg.vocab_size

    def check(self, shape: tuple[int, ...], nbytes: int, op: str) -> None:
        """Logits of a whole sequence over the whole vocabulary ([b, s, V]): the layout keeps V/tp."""
        if len(shape) >= 3 and shape[-1] == self.vocab_size and len(self.run.violations) < 8:
            what = f"full-vocabulary logits {list(shape)} ({op}) on a tp > 1 rank (the layout shards the vocabulary)"
            self.run.violations.append(Violation(self.run.rank, self.step, what, nbytes))


def held_whole(run: RankRun, roles: dict, where: str = "build", only: str | None = None) -> None:
    """Models that hold a weight whole although their layout shards it over tp (``only``: one role's)."""
    for rm in roles.values():
        if only is not None and rm.name != only:
            continue
        for pl, pm in rm.models.items():
            if pl.layout.tp == 1 or (where, rm.name, pl) in run.seen:
                continue
            run.seen.add((where, rm.name, pl))
            full = sharded_weights(rm.cfg, rm.name in ("critic", "reward"))
            for name, p in pm.named.items():
                if full.get(name) == tuple(p.shape):
                    run.violations.append(Violation(run.rank, f"{where} ({rm.name} at {pl})",
                                                    f"{rm.name} holds {name} {list(p.shape)} whole under {pl.layout}",
                                                    p.numel() * p.element_size()))


def rank_job(cfg: Config, plan: ExecutionPlan, run: RankRun, budgets: dict[str, float]) -> RankRun:
    """Build this rank's engine and run iteration 0 under fake tensors (call on the rank's thread,
    its fake world active), recording into ``run``. ``budgets``: call -> bytes above which the
    peak's tensors are kept."""

    comm.set_audit(run.ledger)
    counter = FakeRank()
    guard = _Guard(plan, run)
    with FakeTensorMode(allow_non_fake_inputs=False), counter:
        cache = GroupCache(TIMEOUT_S)
        make_groups(cache, plan_groups(plan, {m.num_key_value_heads for m in model_configs(cfg)}))
        try:
            engine = Engine(cfg, plan, cache, TIMEOUT_S, log=lambda _: None, status=None, warm=False, out=None)
        except Exception as e:
            raise RuntimeError(f"rank {run.rank} failed while building its models: {type(e).__name__}: {e}") from e
        run.built = counter.live
        held_whole(run, engine.roles)
        do = engine._do

        def measured(step: Step) -> None:
            if step.kind == "eval":  # evaluations are left out (every rank skips the same steps)
                return
            run.ledger.step = f"{step.name} (iteration {step.iteration})"
            guard.enter(step, engine.roles)
            counter.check = guard.check if guard.vocab_size else None
            w = counter.start_window(budgets.get(step.call) if step.kind == "call" else None)
            try:
                do(step)
            finally:
                counter.check = None
            if step.kind == "realloc":  # a copy rebuilt from the received shards
                held_whole(run, engine.roles, run.ledger.step, step.role)
            run.steps.append(StepMemory(step.name, step.kind, step.call, w.start, w.peak, w.top))

        engine._do = measured
        for _ in engine.iterate(0, 1):  # the one iteration, to its end
            pass
    run.placeholders = counter.placeholders
    comm.set_audit(None)
    return run


def run_ranks(cfg: Config, plan: ExecutionPlan, ranks: list[int], budgets: dict[int, dict[str, float]],
              stand_in=None, decode: str = "ends", on_done=None
              ) -> tuple[dict[int, RankRun], dict[int, BaseException], list]:
    """Simulate ``ranks`` of ``plan``'s world together (fake_world.py) -> (runs, errors by rank,
    transfer parts never received). ``stand_in(rank)``: the simulated rank whose transfer parts
    stand for an unsimulated sender's (symmetry.py). ``decode``: meshrl.model.worst_case's;
    ``on_done(rank, finished, total)``: Turns.run's."""

    if c10d.is_initialized():
        raise UserError("--dry-run: torch.distributed is already initialised in this process")
    saved = (c10d._world, comm._ctrl_of, comm._ctrl_ids, comm._state)
    cfg = dry_config(cfg)
    worlds = {}
    try:
        for r in ranks:
            worlds[r] = make_world(r, plan.cluster.size)
        turns = Turns(worlds)
        runs = {r: RankRun(r, ledger=RankLedger(r)) for r in ranks}
        transfer.MAILBOX[0] = Mailbox(turns, lambda r: runs[r].ledger.step, stand_in)
        jobs = {r: (lambda r=r: rank_job(cfg, plan, runs[r], budgets.get(r, {}))) for r in ranks}
        with worst_case(decode, device="cpu" if cfg.cluster.device == "cpu" else "cuda"), fast_tolist(), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            _, errors = turns.run(jobs, on_done)
        unread = transfer.MAILBOX[0].unread()
    finally:
        transfer.MAILBOX[0] = None
        if worlds:  # c10d's group maps are the process's: one destroy drops every simulated rank's groups
            next(iter(worlds.values())).activate()
            c10d.destroy_process_group()
        c10d._world, comm._ctrl_of, comm._ctrl_ids, comm._state = saved
    return runs, errors, unread  # a failed rank keeps what it recorded


# A call's peak above OVER x its prediction, and SLACK bytes or more above it, fails the run, naming
# its largest tensors. The slack keeps small models' calls (the demo's: tens of MiB, where a few MiB
# of temporaries are a large share) from failing a check meant for misplaced shards, whose size grows
# with the model; a whole weight or full-vocabulary logits are named by checks of their own
# (fake_exec.py) at any size.
OVER = 1.25
SLACK = 256 * 2**20


def budget(predicted: float) -> float:
    """The bytes a call with ``predicted`` peak bytes may reach before the dry run fails it."""
    return max(OVER * predicted, predicted + SLACK)


def over_budget(run: RankRun, predicted: dict[str, dict[int, float]]) -> list[str]:
    """Calls whose peak on ``run``'s rank exceeds the ``budget`` of the estimator's shards, state and
    activations."""
    out = []
    for s in run.steps:
        p = predicted.get(s.call, {}).get(run.rank) if s.kind == "call" else None
        if p and s.peak > budget(p):
            big = "; ".join(a.what() for a in s.top) or "no single large tensor"
            out.append(f"rank {run.rank}, step '{s.name}': peak {s.peak / 2**30:.2f} GiB is over {OVER}x the "
                       f"estimator's {p / 2**30:.2f} GiB (shards, state, activations) and "
                       f"{SLACK // 2**20} MiB or more above it; the largest tensors made in the call and alive "
                       f"at its peak: {big}")
    return out


@dataclass
class DryRun:
    """What ``dry_run`` found; ``failures`` empty means the plan ran, fit and issued matching collectives."""

    runs: dict[int, RankRun]
    simulated: list[int]
    stand_in: dict[int, int]  # every rank -> the simulated rank that stands for it
    predicted: dict[str, dict[int, float]]  # call -> rank -> predicted peak bytes
    checked: int
    mismatched: list
    failures: list[str]
    seconds: float
    decode: str
    classes: int = 0  # symmetry classes of the plan's ranks

    def measured(self, call: str, rank: int) -> float | None:
        """The peak bytes of ``call`` on ``rank`` (its class's simulated rank's), None if it has none."""
        run = self.runs.get(self.stand_in.get(rank, rank))
        peaks = [s.peak for s in run.steps if s.kind == "call" and s.call == call] if run else []
        return float(max(peaks)) if peaks else None


def dry_run(cfg: Config, problem, plan: ExecutionPlan, every_rank: bool = False, decode: str = "ends",
            log=None) -> DryRun:
    """Simulate ``plan`` (one rank per symmetry class and a checking member of each, or every rank)
    and audit it; ``problem``: the planning problem the memory predictions come from; ``log``: a
    line as each simulated rank finishes."""

    t0 = time.perf_counter()
    rows = {n: problem.specs[n].sequences(problem.shape) // (problem.shape.mini_batches
            if problem.specs[n].kind == "train" else 1) for n in plan.calls}
    n = plan.cluster.size
    cl = Classes(tuple((r,) for r in range(n))) if every_rank else classes(cfg, plan, problem.models, rows)
    simulated = cl.simulated()
    predicted = problem.rank_call_memory(plan)
    budgets = {r: {c: budget(p[r]) for c, p in predicted.items() if r in p} for r in simulated}

    def stand_in(r: int) -> int:
        return r if r in simulated else cl.stand_in(r)

    def done(r: int, k: int, total: int) -> None:
        if log is not None:
            log(f"  simulated rank {r} ({k} of {total}) after {time.perf_counter() - t0:.0f} s")

    runs, errors, unread = run_ranks(cfg, plan, simulated, budgets, stand_in, decode, done)
    checked, mismatched = audit({r: run.ledger for r, run in runs.items()})
    failures = _failures(runs, errors, unread, mismatched, predicted, cl)
    stand = {r: stand_in(r) for r in range(n)}
    return DryRun(runs, simulated, stand, predicted, checked, mismatched, failures, time.perf_counter() - t0, decode,
                  len(cl.members))


def _failures(runs: dict[int, RankRun], errors: dict, unread: list, mismatched: list, predicted: dict, cl) -> list[str]:
    """Everything that fails a dry run, each one line naming ranks and steps: a rank's error (a
    hang named once), unread transfer parts, mismatched collectives, whole weights and
    full-vocabulary tensors, calls over budget, and classes whose two simulated members differ."""
    out = [f"rank {r}: {e}" for r, e in sorted(errors.items())
           if not isinstance(getattr(e, "__cause__", None), Hang) or len(errors) == 1]
    if errors and not out:  # every rank hung: one message says who waits for what
        out.append(str(next(iter(errors.values()))))
    out += [f"rank {s} sent {k} batch part(s) to rank {d} that rank {d} never received" for s, d, k in unread]
    out += [m.message() for m in mismatched]
    for run in runs.values():
        out += [v.message() for v in run.violations] + over_budget(run, predicted)
    for members in cl.members:
        a, b = members[0], members[-1]
        if a != b and a in runs and b in runs:
            why = compare_members(a, b, runs[a].steps, runs[b].steps, runs[a].ledger.ops, runs[b].ledger.ops)
            if why:
                out.append(f"symmetry: {why}")
    return out
