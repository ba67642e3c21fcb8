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
    from ladder.predict import synthetic as sy
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
