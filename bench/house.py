"""The house in figures (issue 36): how much there is to take in, and how the layers meet.

    python bench/house.py [--tree DIR]     # DIR: a checkout (default: this one); old layouts too
    python bench/house.py --by-capability  # the same lines, grouped by what each file serves

Prints one JSON object:
- ``lines``: product lines per package (every .py of the package, blank and comment lines too);
- ``args_outside_cli``: functions outside the command line that take parsed arguments (a
  parameter named ``args`` read as ``args.NAME``); the guide wants 0;
- ``handlers_by_string``: handlers named by a string (``"pkg.module:function"``, or a constant
  handed to ``importlib.import_module``) in the command line; 0 wanted;
- ``callbacks_handed_down``: parameter names through which the command line hands a function of
  its own layer (a def, a lambda, a method of an upper layer) into a lower layer's function; 0;
- ``readme_lines``.
fit/'s floors are drawn by this workplace's `farm-studio look ladder/fit` (old layout: `fit`).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

PACKAGES = ("model", "sources", "trainer", "fit", "predict", "reports", "cli")


def _package_dirs(tree: Path) -> dict[str, Path]:
    """Package -> folder, for the `ladder.*` layout and the older top-level one."""
    out = {}
    for name in PACKAGES:
        for base in (tree / "ladder" / name, tree / name):
            if (base / "__init__.py").is_file():
                out[name] = base
                break
    return out


def _py(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def lines(tree: Path) -> dict[str, int]:
    dirs = _package_dirs(tree)
    out = {name: sum(len(p.read_text().splitlines()) for p in _py(d)) for name, d in dirs.items()}
    taken = {p for d in dirs.values() for p in _py(d)}
    base = [p for p in _py(tree / "ladder") if p not in taken]
    out["base"] = sum(len(p.read_text().splitlines()) for p in base)
    out["total"] = sum(out.values())
    return out


def _takes_args(fn: ast.FunctionDef) -> bool:
    names = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    if "args" not in names:
        return False
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "args" for n in ast.walk(fn))


def args_outside_cli(tree: Path) -> list[str]:
    dirs = _package_dirs(tree)
    cli = dirs.get("cli")
    files = [p for p in _py(tree / "ladder") if cli is None or cli not in p.parents]
    files += [p for name, d in dirs.items() if name != "cli" and tree / "ladder" not in d.parents
              for p in _py(d)]
    out = []
    for p in sorted(set(files)):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_args(n):
                out.append(f"{p.relative_to(tree)}::{n.name}")
    return out


HANDLER = re.compile(r"^[a-z_]\w*(\.[a-z_]\w*)+:[a-z_]\w*$")  # module.path:function


def handlers_by_string(tree: Path) -> list[str]:
    cli = _package_dirs(tree)["cli"]
    out = []
    for p in _py(cli):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and HANDLER.match(n.value):
                out.append(f"{p.relative_to(tree)}:{n.lineno}: {n.value}")
            elif (isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", ""))
                  == "import_module" and n.args and isinstance(n.args[0], ast.Constant)):
                out.append(f"{p.relative_to(tree)}:{n.lineno}: import_module({n.args[0].value})")
    return out


def callbacks_handed_down(tree: Path) -> list[str]:
    """Keyword arguments of calls in the command line whose value is a function: a def of the
    calling function or module, a lambda, or an attribute of an upper layer's class."""
    cli = _package_dirs(tree)["cli"]
    out = set()
    for p in _py(cli):
        mod = ast.parse(p.read_text())
        defs = {n.name for n in ast.walk(mod) if isinstance(n, (ast.FunctionDef,
                                                                 ast.AsyncFunctionDef))}
        for n in ast.walk(mod):
            if not isinstance(n, ast.Call):
                continue
            if getattr(n.func, "attr", "") == "set_defaults":
                continue  # argparse's own wiring of a subcommand to its handler
            for kw in n.keywords:
                v = kw.value
                if (isinstance(v, ast.Lambda) or (isinstance(v, ast.Name) and v.id in defs)
                        or (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name)
                            and v.value.id[:1].isupper())):
                    out.add(f"{p.relative_to(tree)}: {kw.arg}=")
    return sorted(out)


# What the product's lines serve: the first group whose globs (under ladder/) match a file takes
# it, so each specific capability comes before the "rest of" its package (issue 36's line budget
# asks what would have to go).
CAPABILITIES = (
    ("`ladder tokenize` (streaming, resumable; the Grain reader)",
     ("trainer/tokens.py", "trainer/corpus_files.py")),
    ("`ladder run --executor ray` (retries, preemptions)", ("trainer/executor.py",)),
    ("multi-host training (jax.distributed)", ("trainer/distributed.py",)),
    ("`ladder plan` (memory and time, the HLO walk, layouts)",
     ("trainer/plan.py", "trainer/layout.py", "accelerators.py")),
    ("GPU environment flags", ("trainer/gpuenv.py",)),
    ("the rest of the trainer (loop, step, optimizer, checkpoints, run folder, data)",
     ("trainer/*.py", "optspec.py", "lrtable.py")),
    ("the MoE model", ("model/*.py",)),
    ("W&B (runs read; the forecast's and the watcher's runs)",
     ("sources/wandb.py", "predict/wandb_home.py", "wandbrun.py")),
    ("the other metric sources (JSONL, CSV, run folders, key maps)", ("sources/*.py",)),
    ("curve laws (`--form trajectory`, ...)", ("fit/curve_*.py", "fit/lr_schedules.py")),
    ("task laws (`--form task`)", ("fit/task*.py",)),
    ("`ladder isoflop`", ("fit/isoflop.py", "reports/isoflop.py", "fit/allocation.py")),
    ("`ladder compare`", ("fit/compare.py",)),
    ("the law's backtest", ("fit/backtest.py",)),
    ("the rest of `ladder fit` (forms, estimate, solver, law.json, report)", ("fit/*.py",)),
    ("amendments (`--amend`, at a step)", ("predict/amend.py",)),
    ("multi-metric watch", ("predict/watch/multi.py",)),
    ("alert sinks (file, stdout, webhook)", ("predict/sinks.py",)),
    ("the live page (`--serve`)", ("reports/live.py",)),
    ("the rest of preregister and watch (band, forecast, rules, state)", ("predict/**/*.py",)),
    ("the rest of the reports (figures, tables, page)", ("reports/*.py",)),
    ("`ladder demo`", ("cli/demo.py",)),
    ("the rest of the command line (parsers and their help, handlers)", ("cli/*.py",)),
    ("the base (safe input, atomic writes, locks, ladders, counting)", ("*.py",)),
)


def by_capability(tree: Path) -> dict[str, int]:
    """Product lines per capability (:data:`CAPABILITIES`); every file counted once."""
    seen: set[Path] = set()
    out = {}
    for name, globs in CAPABILITIES:
        files = {p for g in globs for p in (tree / "ladder").glob(g) if p.suffix == ".py"}
        out[name] = sum(len(p.read_text().splitlines()) for p in sorted(files - seen))
        seen |= files
    left = sorted(str(p) for p in (tree / "ladder").rglob("*.py")
                  if p not in seen and "__pycache__" not in p.parts)
    assert not left, f"no capability named for {left}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--by-capability", action="store_true",
                    help="a Markdown table of the lines by capability instead")
    opts = ap.parse_args()
    tree = Path(opts.tree).resolve()
    if opts.by_capability:
        counts = by_capability(tree)
        print("| capability | lines |\n|---|---:|")
        for name, n in counts.items():
            print(f"| {name} | {n:,} |")
        print(f"| **total** | **{sum(counts.values()):,}** |")
        return
    a, h, c = args_outside_cli(tree), handlers_by_string(tree), callbacks_handed_down(tree)
    print(json.dumps({"tree": str(tree), "lines": lines(tree),
                      "args_outside_cli": len(a), "handlers_by_string": len(h),
                      "callbacks_handed_down": len(c),
                      "readme_lines": len((tree / "README.md").read_text().splitlines()),
                      "where": {"args_outside_cli": a, "handlers_by_string": h,
                                "callbacks_handed_down": c}}, indent=1))


if __name__ == "__main__":
    main()
