"""fit/ imports without cycles (issue 16): every import of a fit module by another, function-local
ones included, points down the layers named in ladder/fit/law.py's docstring; fit's library never
imports predict, reports, the CLI or JAX."""

import ast
from pathlib import Path

FIT = Path(__file__).resolve().parents[1] / "ladder" / "fit"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ladder.fit":  # from ladder.fit import x: a submodule or a name
                out |= {f"ladder.fit.{a.name}" if (FIT / f"{a.name}.py").exists() else "ladder.fit"
                        for a in node.names}
            else:
                out.add(node.module)
    return out


def _graph() -> dict[str, set[str]]:
    return {f"ladder.fit.{p.stem}" if p.stem != "__init__" else "ladder.fit":
            {m for m in _imports(p) if m == "ladder.fit" or m.startswith("ladder.fit.")}
            for p in FIT.glob("*.py")}


def test_fit_modules_import_each_other_without_cycles():
    g = _graph()
    # the package's __init__ imports its top modules; nothing inside fit imports the package
    assert not [m for m, deps in g.items() if m != "ladder.fit" and "ladder.fit" in deps]
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for d in sorted(g.get(m, ())):
            assert state.get(d) != 1, "import cycle: " + " -> ".join(path + [d])
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])


def test_the_layers_the_law_module_documents():
    g = _graph()
    # lower layers never import the fitting or selection layers above them
    f = "ladder.fit."
    for low in ("forms", "solver", "prediction", "report", "lawjson", "compare"):
        assert not g[f + low] & {f + m for m in ("result", "estimate", "backtest", "task", "law",
                                                 "curve_fit", "curve_law")}, low
    assert f + "law" not in g[f + "result"] | g[f + "estimate"] | g[f + "backtest"] \
        | g[f + "task"] | g[f + "compare"]
    assert "ladder.fit.backtest" not in g["ladder.fit.estimate"] | g["ladder.fit.result"]


def test_fit_has_at_most_six_floors():
    """A module's floor is 1 + the highest floor of the fit modules it imports (1: none); fit/
    keeps to 6 (issue 36: 8 before the selection passes joined fit.law and fit_task and
    compare_points moved into it), so a reader follows at most 6 modules down."""
    g = _graph()
    floor: dict[str, int] = {}

    def of(m):
        if m not in floor:
            floor[m] = 1 + max((of(d) for d in g.get(m, ()) if d != "ladder.fit"), default=0)
        return floor[m]

    assert max(of(m) for m in g) <= 6, sorted(floor.items(), key=lambda kv: -kv[1])


def test_fit_imports_nothing_above_it_and_no_jax():
    # ladder/cli/fit.py is the `ladder fit`/`ladder predict` handler: the CLI layer, above
    # predict (it reads W&B offline runs with predict.sources); the library is everything else
    for p in FIT.glob("*.py"):
        if p.name == "commands.py":
            continue
        bad = {m for m in _imports(p) if m.split(".")[0] in ("jax", "flax", "optax")
               or m.startswith(("ladder.predict", "ladder.reports"))
               or m in ("ladder.cli.main", "ladder.cli.demo", "ladder.trainer.train")}
        assert not bad, f"{p.name} imports {sorted(bad)}"
