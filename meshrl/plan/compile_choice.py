"""``train.compile=auto`` / ``gen.compile=auto``: compile where the run is long enough to win the
compile back.

torch.compile makes each decoder layer faster by a factor the device's profile measures
(profile/compile.py: compiled over eager seconds for a forward, a forward + backward and a decoding
step) and costs a one-off compile (the profile's ``compile_s``, seconds per kind). For each setting
left at auto, the planner prices the run's plan in the steady state with and without it
(plan/simulator.py), multiplies the saving per iteration by the iterations the run has left and
turns it on only if that exceeds the compile's seconds. Where nothing measured the factors (a CPU
without `meshrl profile`, the GPU presets: plan/hardware.py COMPILE_GPU) there is no saving to
count, and auto stays eager.

Pure planning: no torch, no process groups. The runtime resolves the choice once, when a run
starts, and keeps it across resumes (compiled kernels round differently from eager ones).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .execution_plan import ExecutionPlan
from .problem import Problem
from .simulator import iteration_time

# which compiles each setting pays for: profile/compile.py's kinds
KINDS = {"train": ("fwd", "fwd_bwd"), "gen": ("decode",)}
SHAPE_KEY = {"train": "compile_layers", "gen": "compile_gen"}
# why auto stays eager on a CPU that the planner prices by a stand-in (plan/fallback.py)
NO_PROFILE = "no profile of this CPU measures what compiling saves: `meshrl profile`"


@dataclass(frozen=True)
class CompileChoice:
    """The resolved ``train.compile`` and ``gen.compile`` and, per setting that was auto, the
    predicted seconds it saves over the run and the seconds its compile costs."""

    train: bool
    gen: bool
    saved_s: dict[str, float]  # "train" / "gen" -> seconds saved over the run's iterations (auto only)
    cost_s: dict[str, float]  # -> the one-off compile's seconds
    why: str = ""  # why auto stays eager without weighing (nothing measured), else ""

    def line(self) -> str:
        """One line for the run's header."""
        on = {"train": self.train, "gen": self.gen}
        state = f"training {'on' if self.train else 'off'}, generation {'on' if self.gen else 'off'}"
        if self.why:
            return f"compile: {state} (auto: {self.why})"
        if not self.saved_s:
            return f"compile: {state}"
        parts = [f"{'training' if k == 'train' else 'generation'} saves {self.saved_s[k]:.0f} s for "
                 f"{self.cost_s[k]:.0f} s of compiling" + ("" if on[k] else ": not worth it")
                 for k in self.saved_s]
        return f"compile: {state} (auto, predicted over the run: {'; '.join(parts)})"


def measured(problem: Problem) -> bool:
    """Whether the problem's hardware has measured compile factors and compile times (a profile's);
    the presets have neither."""
    c = problem.hw.compiled
    return (c.fwd, c.fwd_bwd, c.decode) != (1.0, 1.0, 1.0) and bool(c.compile_s)


def with_setting(problem: Problem, kind: str, on: bool) -> Problem:
    return dataclasses.replace(problem, shape=dataclasses.replace(problem.shape, **{SHAPE_KEY[kind]: on}))


def choose_compile(problem: Problem, plan: ExecutionPlan, iterations: int, train: bool | str, gen: bool | str,
                   unmeasured: str = "") -> CompileChoice:
    """``train`` / ``gen``: the config's train.compile / gen.compile (True, False or "auto");
    ``iterations``: the iterations the run has left; ``unmeasured``: why the problem's costs are not
    this machine's (a CPU priced by a stand-in preset), which keeps auto eager."""
    settings = {"train": train, "gen": gen}
    fixed = {k: v for k, v in settings.items() if v != "auto"}
    auto = [k for k in settings if k not in fixed]
    if not auto:
        return CompileChoice(bool(train), bool(gen), {}, {})
    why = unmeasured or ("" if measured(problem) else f"no measurement of torch.compile on {problem.hw.name}")
    if why:
        return CompileChoice(bool(fixed.get("train", False)), bool(fixed.get("gen", False)), {}, {}, why)
    base = problem
    for k, v in fixed.items():
        base = with_setting(base, k, bool(v))
    for k in auto:
        base = with_setting(base, k, False)
    eager = iteration_time(base, plan)
    cost = dict(problem.hw.compiled.compile_s)
    saved, cost_s, out = {}, {}, dict(fixed)
    for k in auto:
        saved[k] = max(0.0, (eager - iteration_time(with_setting(base, k, True), plan)) * iterations)
        cost_s[k] = sum(cost.get(kind, 0.0) for kind in KINDS[k])
        out[k] = saved[k] > cost_s[k]
    return CompileChoice(bool(out["train"]), bool(out["gen"]), saved, cost_s)


def choose_for_config(cfg, problem: Problem, plan: ExecutionPlan, unmeasured: str = "") -> CompileChoice:
    """``choose_compile`` for a run's config (meshrl/config Config) over all its iterations;
    gen.backend=vllm compiles its own way, so gen.compile stays off there."""
    gen = cfg.gen.compile if cfg.gen.backend == "meshrl" else False
    return choose_compile(problem, plan, cfg.train.iterations, cfg.train.compile, gen, unmeasured)
