"""The layers stay honest: meshrl's import graph (every import statement of every module, lazy ones
inside functions included, read with ``ast``) has no upward edge, no cycle between packages and no
cycle between files, and every import left inside a function says why on its line.

Layers, bottom up (DESIGN.md "One path"): errors, cores and host_memory; config (the sections, which
every package reads: it imports nothing of meshrl but errors); model (knows no ranks); layout (pure
rank and shard math) and data; algo (the calls, written against a model handle: no runtime, no
layout, no parallel code); parallel; gen (generation backends); realloc; plan (pure: no torch.distributed, no runtime);
observe; runtime; profile (measures the machine by running the layers below); commands and cli on
top. The top-level modules are layers like the packages (no exemption)."""

from __future__ import annotations

import ast
from pathlib import Path

import meshrl

ROOT = Path(meshrl.__file__).parent
# package -> packages it must never import (directly or lazily)
TOP = {"commands", "cli"}
EVERY = {"algo", "model", "layout", "data", "parallel", "gen", "realloc", "plan", "observe", "runtime", "profile",
         *TOP}
FORBIDDEN = {
    "errors": EVERY | {"config", "cores", "host_memory"},
    "cores": EVERY | {"config", "host_memory"},
    "host_memory": EVERY | {"config", "cores"},
    "config": EVERY | {"cores", "host_memory"},
    "algo": {"runtime", "parallel", "realloc", "layout", "plan", "profile", *TOP},
    "model": {"parallel", "runtime", "realloc", "layout", "algo", "plan", "profile", *TOP},
    "layout": {"parallel", "runtime", "realloc", "algo", "plan", "profile", *TOP},
    "plan": {"runtime", "parallel", "realloc", "profile", *TOP},
    "parallel": {"runtime", "realloc", "algo", "plan", "profile", *TOP},
    "realloc": {"runtime", "algo", "plan", "profile", *TOP},
    "data": {"runtime", "parallel", "realloc", "algo", "plan", "profile", *TOP},
    "observe": {"runtime", "profile", *TOP},
    "gen": {"runtime", "algo", "plan", "realloc", "profile", *TOP},
    "runtime": {"profile", *TOP},
    "profile": TOP,
    "commands": {"cli"},
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
    """A module's layer: its subpackage (meshrl.algo.calls -> algo) or, for a top-level module, its
    own name (meshrl.cores -> cores); None outside meshrl."""
    parts = module.split(".")
    if parts[0] != "meshrl" or len(parts) < 2:
        return None
    return parts[1]


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
            a, b = layer(mod), layer(dep)
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


def file_cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted. A module's
    import of its own package (``from . import x`` in a package's file) is not an edge."""
    edges = {m: {d for d in deps if d in g and d != m and not m.startswith(d + ".")} for m, deps in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def test_no_cycle_between_files():
    """Issue 29: no two modules import each other, however indirectly, counting the imports inside
    functions (a cycle closed by a lazy import is still a cycle)."""
    cycles = file_cycles(graph())
    assert not cycles, "file-level import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def lazy_imports(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every import statement inside a function of ``path``."""
    lines = path.read_text().splitlines()
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    text = " ".join(lines[i].strip() for i in range(node.lineno - 1, node.end_lineno))
                    out.append((node.lineno, text))
    return out


def test_every_import_inside_a_function_says_why():
    """An import inside a function is for an optional or slow dependency, or keeps the planner's
    commands torch-free; its line carries the reason as a comment."""
    bad = [f"{p.relative_to(ROOT.parent)}:{n}: {text}" for p in sorted(ROOT.rglob("*.py"))
           for n, text in lazy_imports(p) if "#" not in text]
    assert not bad, "imports inside functions without a reason:\n" + "\n".join(bad)


def test_the_cycle_check_sees_a_lazy_cycle():
    """A cycle closed by an import inside a function is found (else the test above checks nothing)."""
    g = {"meshrl.a": {"meshrl.b"}, "meshrl.b": {"meshrl.c"}, "meshrl.c": {"meshrl.a"}, "meshrl.d": {"meshrl.a"}}
    assert file_cycles(g) == [["meshrl.a", "meshrl.b", "meshrl.c"]]


def test_the_check_sees_an_upward_edge(tmp_path, monkeypatch):
    """The graph reader resolves relative and lazy imports (else the tests above check nothing)."""
    g = graph()
    assert "meshrl.algo.calls" in g["meshrl.runtime.engine"]  # a relative import across packages
    assert "meshrl.runtime.job" in g["meshrl.commands.train"]  # a lazy one, inside a function
    assert any("runtime.job" in text for _, text in lazy_imports(ROOT / "commands" / "train.py"))
    src = tmp_path / "meshrl" / "algo"
    src.mkdir(parents=True)
    (src / "bad.py").write_text("def f():\n    from ..runtime.engine import (\n        Engine)\n")
    assert lazy_imports(src / "bad.py") == [(2, "from ..runtime.engine import ( Engine)")]  # no reason: '#' absent
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "meshrl")
    assert "meshrl.runtime.engine" in imports(src / "bad.py")
