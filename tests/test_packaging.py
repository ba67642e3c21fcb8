"""The core install: `pip install .` (no extras) into a fresh virtual environment fits a CSV and
forecasts from it while `import jax` fails (fit, predict and reports need no JAX, no wandb)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def test_core_dependencies_and_extras_are_declared():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].strip() for d in meta["dependencies"]}
    # orjson: the JSON-lines parser (issue 24 item 3), ~0.4 MB installed
    assert core == {"numpy", "scipy", "pandas", "matplotlib", "orjson"}
    extras = meta["optional-dependencies"]
    assert {"train", "wandb", "ray", "parquet", "all", "dev"} <= set(extras)
    assert any(d.startswith("jax>=") for d in extras["train"])
    assert extras["wandb"] == ["wandb>=0.19.10"]


@pytest.mark.slow  # a fresh venv and a download of the core dependencies: a minute or more
def test_fresh_core_install_fits_a_csv_without_jax(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "runs", "demo_out", "*.egg-info", "build", "wandb"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src)], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(py), "-c", "import jax"], capture_output=True, text=True)
    assert r.returncode != 0 and "No module named 'jax'" in r.stderr
    r = subprocess.run([str(py), "-c", "import wandb"], capture_output=True, text=True)
    assert r.returncode != 0

    sys.path.insert(0, str(ROOT))
    from tests import synthetic as sy
    pts = sy.points_table([sy.make_run(sy.Truth(), t, seed=i)
                           for i, t in enumerate(sy.ladder_targets(5, steps0=60))])
    work = tmp_path / "work"
    work.mkdir()
    pts.to_csv(work / "points.csv", index=False)
    ladder = venv / "bin" / "ladder"
    r = subprocess.run([str(ladder), "fit", "points.csv", "--form", "compute", "--bootstrap",
                        "20"], cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "wrote law.json" in r.stdout and (work / "law.json").is_file()
    r = subprocess.run([str(ladder), "predict", "law.json", "--compute", "1e20"], cwd=work,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and '"loss"' in r.stdout, r.stderr[-2000:]
    r = subprocess.run([str(py), "-m", "ladder", "report", "--law", "law.json", "--out", "rep"],
                       cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and (work / "rep" / "index.html").is_file(), r.stderr[-2000:]


# ------------------------------------------------------------------ the wheel (issue 36 item 1)

def _source_copy(dest: Path) -> Path:
    """The tree as a fresh clone has it: no venv, no build leftovers (a stale build/ would put
    old modules into the wheel and hide a missing package)."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "runs", "demo_out", "*.egg-info", "build", "dist",
        "wandb", ".hypothesis"))
    return dest


def _wheel(tmp_path: Path) -> Path:
    out = tmp_path / "wheel"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        str(_source_copy(tmp_path / "src")), "-w", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("ladder-*.whl")
    return whl


def _shipped(root: Path) -> set[str]:
    """What the package is: every module and data file under ladder/ (found, never listed)."""
    return {p.relative_to(root).as_posix() for p in (root / "ladder").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".toml")}


def test_the_wheel_holds_the_tree_and_only_ladder_at_the_top(tmp_path):
    """The wheel's files are exactly the package's files in the tree (a subpackage that a
    hand-kept list forgot, like predict.sources once, fails here), under one top-level name."""
    import zipfile

    names = zipfile.ZipFile(_wheel(tmp_path)).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ladder"}, tops
    in_wheel = {n for n in names if n.startswith("ladder/")}
    tree = _shipped(ROOT)
    assert in_wheel == tree, (f"missing from the wheel: {sorted(tree - in_wheel)}; "
                              f"not in the tree: {sorted(in_wheel - tree)}")


@pytest.mark.slow  # trains the tiny ladder from an installed wheel: about two minutes
def test_the_tiny_path_from_an_installed_wheel(tmp_path):
    """An installed wheel, not the checkout: a fresh venv gets the wheel alone (its dependencies
    are this interpreter's, seen through a .pth file, so nothing is downloaded), and the tiny
    ladder goes list -> run the rungs -> fit -> preregister -> run the target -> watch -> report
    in a folder with no checkout on the path. site-packages gains only `ladder`."""
    import sysconfig

    import os

    whl = _wheel(tmp_path)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no checkout on the path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], capture_output=True, text=True, env=clean,
                               check=True).stdout.strip())
    before = {p.name for p in site.iterdir()}
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", "--no-index", str(whl)], capture_output=True, text=True,
                       env=clean, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    added = {p.name for p in site.iterdir()} - before
    assert {a for a in added if not a.endswith(".dist-info")} == {"ladder"}, added
    (site / "zz_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu",
           "WANDB_MODE": "offline", "MPLBACKEND": "Agg"}

    def ladder(*argv, ok=(0,)):
        r = subprocess.run([str(venv / "bin" / "ladder"), *argv], cwd=work, env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode in ok, (argv, r.stdout[-1500:], r.stderr[-2000:])
        return r

    where = subprocess.run([str(py), "-c", "import ladder, ladder.sources; print(ladder.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where
    rungs = ladder("list", "tiny", "--json").stdout
    import json
    names = [r["name"] for r in json.loads(rungs)]
    target = names[-1]
    ladder("run", "tiny", "--out", "runs", "-q", *[a for n in names[:-1] for a in ("--rung", n)])
    ladder("fit", "runs/tiny", "--out", "law.json")
    ladder("preregister", "law.json", "--target", f"tiny:{target}", "--runs", "runs",
           "--out", "prereg.json")
    ladder("run", "tiny", "--rung", target, "--out", "runs", "-q")
    ladder("watch", "prereg.json", "--source", f"runs/tiny/{target}", "--alerts", "alerts.jsonl",
           ok=(0, 1, 2))
    ladder("report", "--runs", "runs", "--law", "law.json", "--prereg", "prereg.json",
           "--alerts", "alerts.jsonl", "--out", "report")
    assert (work / "report" / "index.html").is_file()
