"""bench/gpu_rung.py on a bare GPU image (issue 37 item 5): with orjson, grain, wandb, ray (and
tqdm, pandas, scipy) unimportable it still imports and runs its phases (tiny shapes on CPU)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("orjson", "grain", "wandb", "ray", "tqdm", "pandas", "scipy")

# a meta-path finder ahead of every other: importing a blocked package (or a submodule) fails as
# it would where it is not installed
BLOCKER = f"""
import sys
BLOCKED = {BLOCKED!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""


def run_blocked(code: str, tmp_path: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{ROOT}", "JAX_PLATFORMS": "cpu",
           "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_blocker_blocks(tmp_path):
    r = run_blocked("import orjson", tmp_path)
    assert r.returncode != 0 and "blocked" in r.stderr


def test_bench_runs_without_optional_packages(tmp_path):
    out = tmp_path / "out"
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['gpu_rung.py', '--smoke', '--out', {str(out)!r}, '--steps', '1',\n"
        "            '--skip', 'checkpoint,profile', '--budget-s', '900']\n"
        "try:\n"
        "    runpy.run_path('bench/gpu_rung.py', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"assert not any(m.split('.')[0] in {BLOCKED!r} for m in sys.modules)\n")
    r = run_blocked(code, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "gpu_rung.json").read_text())
    status = {k: v["status"] for k, v in doc["phases"].items()}
    assert status == {"setup": "done", "data": "done", "train": "done", "eval": "done",
                      "checkpoint": "skipped", "profile": "skipped"}, doc["phases"]
    assert doc["phases"]["data"]["feed"].startswith("in order")      # no grain
    assert doc["phases"]["setup"]["batch_per_device"] == 2
    assert doc["gpu_env"]["gpu"] is False                             # CPU: nothing set
    assert doc["phases"]["train"]["tokens_per_s"] > 0
