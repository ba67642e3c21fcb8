"""The train step on a (2 data x 4 expert) mesh of 8 host devices matches one device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs in a subprocess: XLA_FLAGS must be set before JAX initialises its CPU backend.
SCRIPT = r"""
import json, sys
from ladder.io import read_json, read_metrics
from ladder.specs import LADDERS
from ladder.train import TrainConfig, train_rung
import jax
assert len(jax.devices()) == 8, jax.devices()
rung = LADDERS["tiny"].rungs[0]
out = {}
for n, ep in ((1, 1), (8, 4)):
    d = f"{sys.argv[1]}/{n}"
    train_rung(rung, d, TrainConfig(devices=n, expert_parallel=ep, peak_flops=1e11,
                                    progress=False), max_steps=4)
    rows = read_metrics(f"{d}/metrics.jsonl")
    out[n] = {"loss": [r["train/loss"] for r in rows], "gnorm": [r["grad/norm"] for r in rows],
              "mesh": read_json(f"{d}/config.json")["mesh"]["shape"]}
# the routed experts are split over "expert" (E/4 per device), the rest replicated
import model as M
from ladder.train import init_state, make_mesh
state = init_state(rung.model, TrainConfig(), make_mesh(8, 4, rung.model.n_experts, rung.batch))
routed = M.param_groups(state["params"])["routed_experts"]
out["routed_shard_rows"] = sorted({s.data.shape[0] for x in routed for s in x.addressable_shards})
out["attention_shard_rows"] = sorted({s.data.shape == x.shape
                                      for x in M.param_groups(state["params"])["attention"]
                                      for s in x.addressable_shards})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_eight_device_mesh_matches_one_device(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    one, eight = out["1"], out["8"]
    assert one["mesh"] == {"data": 1, "expert": 1} and eight["mesh"] == {"data": 2, "expert": 4}
    assert len(one["loss"]) == len(eight["loss"]) == 4
    for a, b in zip(one["loss"], eight["loss"], strict=True):
        assert b == pytest.approx(a, abs=1e-5)
    assert out["routed_shard_rows"] == [1]   # tiny has 4 experts: one per device of the axis
    assert out["attention_shard_rows"] == [True]
    for a, b in zip(one["gnorm"], eight["gnorm"], strict=True):
        assert b == pytest.approx(a, rel=1e-4)
