"""Shared fixtures."""

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's headless Chromium (.ci/run installs it). Missing: skipped on a workstation, a
    failure under CI (CI=true), where a skipped browser test would pass unseen."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return Path(found)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("headless Chromium is not installed (apt-get install chromium); under CI "
                    "the browser tests must run")
    pytest.skip("headless Chromium not installed (apt-get install chromium)")


def chromium_dom(chromium: Path, url: str, profile: Path, *, budget_ms: int = 5000) -> str:
    """The DOM of ``url`` after ``budget_ms`` of (virtual) time in headless Chromium."""
    import subprocess
    cmd = [str(chromium), "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", f"--user-data-dir={profile}",
           f"--virtual-time-budget={budget_ms}", "--dump-dom", url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False).stdout


# Source for run_on_fake_devices scripts: the model's weights on a (2 data x 4 expert) mesh of 8
# devices, routed experts split on "expert" and everything else replicated, the batch split over
# data x expert (how tests/test_model_*.py check that expert-parallel MoE layers match one device)
EXPERT_MESH_SRC = """
import jax
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from ladder.model.transformer import param_group

def on_expert_mesh(params, tokens):
    mesh = jax.make_mesh((2, 4), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)
    def place(path, x):
        spec = P("expert") if param_group(path) == "routed_experts" else P()
        return jax.device_put(x, NamedSharding(mesh, spec))
    sharded = unflatten_dict({k: place(k, v) for k, v in flatten_dict(params).items()})
    return mesh, sharded, jax.device_put(tokens, NamedSharding(mesh, P(("data", "expert"))))
"""


def run_on_fake_devices(script: str, *args: str, devices: int = 8, timeout: int = 900) -> str:
    """Run ``script`` (Python source) in a fresh process with ``devices`` fake CPU devices (the
    XLA flag must be set before JAX starts, so never in this process), from the checkout; its
    stdout. A failure shows the end of its stderr."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", script, *args], cwd=root, env=env,
                       capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.fixture()
def prereg_path(tmp_path):
    """The watcher tests' pre-registration (helpers.watch_world's target), in tmp_path."""
    from helpers import write_watch_prereg
    return write_watch_prereg(tmp_path / "prereg.json")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(run directory, summary) of the tiny ladder's first rung trained once, uninterrupted, at a
    given peak (no matmul measured; tests/test_train_run.py's and test_train_preempt.py's CFG):
    the reference the resume tests compare with. Read it; never write into it."""
    from ladder.specs import LADDERS
    from ladder.trainer.train import train_rung
    from ladder.trainer.trainconfig import RunArgs, TrainConfig

    out = tmp_path_factory.mktemp("tiny_run") / "run"
    cfg = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False))
    return out, train_rung(LADDERS["tiny"].rungs[0], out, cfg)
