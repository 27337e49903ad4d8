"""The layers stay honest: meshrl's import graph (every import statement of every module, lazy ones
inside functions included, read with ``ast``) has no upward edge and no cycle between packages.

Layers, bottom up (DESIGN.md "One path"): errors, config; model (knows no ranks); layout (pure rank
and shard math) and data; algo (the calls, written against a model handle: no runtime, no layout,
no parallel code); parallel; gen (generation backends); realloc; plan (pure: no torch.distributed, no runtime); observe;
runtime; commands and cli on top."""

from __future__ import annotations

import ast
from pathlib import Path

import meshrl

ROOT = Path(meshrl.__file__).parent
# package -> packages it must never import (directly or lazily)
FORBIDDEN = {
    "algo": {"runtime", "parallel", "realloc", "layout", "plan", "commands", "cli"},
    "model": {"parallel", "runtime", "realloc", "layout", "algo", "plan", "commands", "cli"},
    "layout": {"parallel", "runtime", "realloc", "algo", "plan", "commands", "cli"},
    "plan": {"runtime", "parallel", "realloc", "commands", "cli"},
    "parallel": {"runtime", "realloc", "algo", "plan", "commands", "cli"},
    "realloc": {"runtime", "algo", "plan", "commands", "cli"},
    "data": {"runtime", "parallel", "realloc", "algo", "plan", "commands", "cli"},
    "observe": {"runtime", "commands", "cli"},
    "gen": {"runtime", "algo", "plan", "realloc", "commands", "cli"},
    "runtime": {"commands", "cli"},
}
NO_DISTRIBUTED = ("plan", "layout", "model")  # packages that never import torch.distributed


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved; a name imported
    from a package counts as that package's submodule when one exists)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            for a in node.names:
                if (ROOT.parent / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").is_file():
                    out.add(f"{base}.{a.name}")
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in ROOT.rglob("*.py")}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "meshrl" and len(parts) > 1 else None


def package(module: str) -> str | None:
    """The subpackage a module belongs to (meshrl.algo, meshrl.plan, ...); None for the top-level
    modules (config, errors, cli), which the cycle check leaves out: config's validation reads
    names it checks from the packages (device and model presets, recipe keys), lazily."""
    name = layer(module)
    return name if name and (ROOT / name).is_dir() else None


def test_no_upward_edge():
    bad = []
    for mod, deps in graph().items():
        here = layer(mod)
        for dep in deps:
            if layer(dep) in FORBIDDEN.get(here, set()):
                bad.append(f"{mod} imports {dep}")
            if here in NO_DISTRIBUTED and dep.startswith("torch.distributed"):
                bad.append(f"{mod} imports {dep}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_no_cycle_between_packages():
    edges: dict[str, set[str]] = {}
    for mod, deps in graph().items():
        for dep in deps:
            a, b = package(mod), package(dep)
            if a and b and a != b:
                edges.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:  # depth-first; a grey node met again closes a cycle
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                raise AssertionError("package cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)


def test_the_check_sees_an_upward_edge(tmp_path, monkeypatch):
    """The graph reader resolves relative and lazy imports (else the tests above check nothing)."""
    g = graph()
    assert "meshrl.algo.calls" in g["meshrl.runtime.engine"]  # a relative import across packages
    assert "meshrl.plan.search" in g["meshrl.runtime.plans"]  # a lazy one, inside a function
    src = tmp_path / "meshrl" / "algo"
    src.mkdir(parents=True)
    (src / "bad.py").write_text("def f():\n    from ..runtime.engine import Engine\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "meshrl")
    assert "meshrl.runtime.engine" in imports(src / "bad.py")
