"""The layers of shared/DESIGN.md §2, read from the folders and checked by static import analysis
(no module is imported):

    model/  <-  ladder/ (the base)  <-  fit/  <-  predict/  <-  reports/  <-  cli/ (commands, demo)
                    ^--- ladder/trainer/ (on ladder/model/ and the base, beside ladder/fit/)

A module's layer is the folder it lives in (``FOLDERS``; the deepest folder that names a layer
wins, so ``ladder/trainer/step.py`` is the trainer and ``ladder/io.py`` the base): no list of
modules is kept by hand, and a new file is in a layer by where it is put.

Every ``import`` in every module of these folders counts, the ones inside functions too (a lazy
import still couples the modules), and so does a module named as a constant string to
``importlib.import_module`` or ``runpy.run_module`` (an import all the same). Three rules (and a
fourth: none of them imports tests/ or bench/, which stand above them all):
1. nothing imports upward (nor the trainer from fit/predict/reports, nor those from the trainer);
2. no cycle between modules;
3. JAX, flax, optax and orbax are reached only from model/ and the trainer: no chain of imports
   from the base, fit, predict or reports leads to them (a user fitting a CSV must not need JAX).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JAX = ("jax", "jaxlib", "flax", "optax", "orbax")

# Folder -> layer. The README's map ("Where things live") says the same in words.
FOLDERS = {
    "ladder/model": "model",
    "ladder": "base",             # plain Python that fit, predict, reports and the trainer stand on
    "ladder/trainer": "trainer",  # JAX: training rungs
    "ladder/fit": "fit",
    "ladder/predict": "predict",
    "ladder/reports": "reports",
    "ladder/cli": "top",          # the `ladder` command line and the demo
}
PACKAGES = tuple(f for f in FOLDERS if "/" not in f)

# What each layer may import (besides itself). The trainer sits beside fit: neither sees the other.
ALLOWED = {
    "model": {"model"},
    "base": {"model", "base"},
    "trainer": {"model", "base", "trainer"},
    "fit": {"model", "base", "fit"},
    "predict": {"model", "base", "fit", "predict"},
    "reports": {"model", "base", "fit", "predict", "reports"},
    "top": {"model", "base", "trainer", "fit", "predict", "reports", "top"},
}
NO_JAX = {"base", "fit", "predict", "reports"}

# The one place a lower folder names a higher one, and why. `python -m ladder` runs
# ladder/__main__.py (Python looks for it in the package's own folder), and the command line it
# starts lives in cli/, above: the file hands over by name with runpy (no import, nothing imports
# it). Any other handover fails test_nothing_imports_upward.
HANDOVERS = {("ladder.__main__", "ladder.cli")}


def layer(module: str) -> str:
    """The layer of a module, from the deepest folder of FOLDERS that holds it."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if (folder := "/".join(parts[:i])) in FOLDERS:
            return FOLDERS[folder]
    raise AssertionError(f"{module}: in no layer's folder (tests/test_layers.py FOLDERS)")


@functools.lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (``from pkg import sub`` names pkg.sub)."""
    mods = modules()
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the package of this module
        pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


@functools.lru_cache(maxsize=1)
def edges() -> dict[str, dict[str, int]]:
    """module -> {imported name (ours resolved to a module, others as written): first line}."""
    mods = modules()
    out: dict[str, dict[str, int]] = {}
    for module, path in mods.items():
        got: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(module, path, node):
                    got.setdefault(t, node.lineno)
            elif (t := _by_name(node)) is not None:
                got.setdefault(t, node.lineno)
        out[module] = got
    return out


def _by_name(node: ast.AST) -> str | None:
    """The module that ``importlib.import_module("m")`` or ``runpy.run_module("m")`` loads, when
    its name is a constant (a package run by runpy runs its ``__main__``)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    target = node.args[0].value
    if name == "run_module" and f"{target}.__main__" in modules():
        return f"{target}.__main__"
    return target if name in ("import_module", "run_module", "__import__") else None


def _ours(name: str) -> str | None:
    """The module of ours that importing ``name`` runs (a name inside a module: that module)."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def test_every_module_has_a_layer_and_every_layer_a_folder():
    for m in modules():
        layer(m)
    for folder in FOLDERS:
        assert (ROOT / folder / "__init__.py").is_file(), f"{folder}/: a layer with no package"


def test_nothing_imports_upward():
    bad = []
    for m, targets in edges().items():
        for t, line in targets.items():
            ours = _ours(t)
            if ours is None or t.split(".")[0] not in PACKAGES:
                continue
            if any(m == src and (ours + ".").startswith(pkg + ".") for src, pkg in HANDOVERS):
                continue
            if layer(ours) not in ALLOWED[layer(m)]:
                bad.append(f"{modules()[m].relative_to(ROOT)}:{line}: {m} ({layer(m)}) imports "
                           f"{ours} ({layer(ours)})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_each_handover_is_still_there_and_by_name_only():
    """HANDOVERS names an exception that exists (it cannot outlive its reason), and a handover
    never becomes an ``import`` statement (which would run the folder above on every import)."""
    for src, package in HANDOVERS:
        path = modules()[src]
        targets = {t for t in edges()[src] if (t + ".").startswith(package + ".")}
        assert targets, f"{src} no longer names {package}: drop it from HANDOVERS"
        imported = {t for n in ast.walk(ast.parse(path.read_text()))
                    if isinstance(n, (ast.Import, ast.ImportFrom))
                    for t in _targets(src, path, n)}
        assert not {t for t in imported if t.split(".")[0] == package}, src


def test_the_library_imports_neither_tests_nor_bench():
    """tests/ and bench/ stand on top of everything (bench/fuzz_inputs.py writes its runs with
    tests/helpers.py; tests import bench scripts to run them): no module of the library imports
    either, so neither ever ships in what a user imports."""
    above = ("tests", "bench", "helpers", "conftest")
    bad = [f"{modules()[m].relative_to(ROOT)}:{line}: {m} imports {t}"
           for m, targets in edges().items() for t, line in targets.items()
           if t.split(".")[0] in above]
    assert not bad, "\n".join(bad)


def _cycles() -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: {o for t in ts if (o := _ours(t)) and o != m} for m, ts in edges().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    cycles = [sorted(c) for c in _cycles()]
    assert not cycles, f"import cycles (function-local imports count): {cycles}"


def test_jax_only_in_model_and_the_trainer():
    """No chain of imports (package __init__ files included, since importing ``a.b`` runs
    ``a/__init__.py``) leads from the base, fit, predict or reports to JAX."""
    graph: dict[str, set[str]] = {}
    for m, targets in edges().items():
        nxt = set()
        for t in targets:
            if t.split(".")[0] in JAX:
                nxt.add(t.split(".")[0])
            elif (ours := _ours(t)) is not None:
                if any(m == src and (ours + ".").startswith(pkg + ".") for src, pkg in HANDOVERS):
                    continue  # runs only as `python -m ladder`, never on an import of the base
                parts = ours.split(".")
                nxt |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[m] = nxt - {m}

    def chain(start: str) -> list[str] | None:
        seen, todo = {start: [start]}, [start]
        while todo:
            v = todo.pop(0)
            for w in sorted(graph.get(v, ())):
                if w in seen:
                    continue
                seen[w] = seen[v] + [w]
                if w in JAX:
                    return seen[w]
                todo.append(w)
        return None

    bad = [" -> ".join(c) for m in modules() if layer(m) in NO_JAX and (c := chain(m))]
    assert not bad, "JAX reached outside ladder/model/ and the trainer:\n" + "\n".join(bad)


def test_the_analysis_sees_function_local_and_relative_imports(tmp_path):
    """The checker itself: a lazy import inside a function and a relative import are both seen."""
    src = "def f():\n    from ladder.fit.law import fit_law\n    from . import io\n"
    tree = ast.parse(src)
    path = ROOT / "ladder" / "specs.py"
    names = [t for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for t in _targets("ladder.specs", path, n)]
    assert names == ["ladder.fit.law", "ladder.io"]
    assert layer("ladder.fit.law") not in ALLOWED[layer("ladder.specs")]


def test_the_analysis_sees_imports_by_name_and_reads_layers_from_folders():
    src = ("import importlib, runpy\nimportlib.import_module('ladder.fit.law')\n"
           "runpy.run_module('ladder')\n")
    found = [t for n in ast.walk(ast.parse(src)) if (t := _by_name(n))]
    assert found == ["ladder.fit.law", "ladder.__main__"]
    assert [layer(m) for m in ("ladder.io", "ladder.trainer.step", "ladder.trainer",
                               "ladder.cli.demo",
                               "ladder.predict.watch.rules.loss")] == \
        ["base", "trainer", "trainer", "top", "predict"]
    assert layer("ladder.trainer.step") not in ALLOWED[layer("ladder.specs")]
