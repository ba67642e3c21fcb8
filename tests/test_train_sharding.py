"""The train step on a (2 data x 4 expert) mesh of 8 host devices, expert-parallel (shard_map +
all_to_all) and microbatched, matches one device over 20 steps (float32)."""

import json
from pathlib import Path

import pytest
from conftest import run_on_fake_devices

ROOT = Path(__file__).resolve().parent.parent

# Runs in a subprocess: XLA_FLAGS must be set before JAX initialises its CPU backend.
SCRIPT = r"""
import json, sys
from ladder.io import read_json, read_metrics
from ladder.specs import LADDERS
from ladder.train import train_rung
from ladder.trainconfig import RunArgs, TrainConfig
import jax
assert len(jax.devices()) == 8, jax.devices()
# batch 16 so that a microbatch of 8 puts one sequence on each of the 8 devices; capacity factor
# E/k = 2 gives each (sender shard, expert) cell all of its tokens' slots: nothing is dropped,
# so 1 device and 8 devices compute the same function (with drops the cells differ by design)
rung = LADDERS["tiny"].rungs[0].replace(batch=16, steps=20)
model = {"capacity_factor": 2.0}
out = {}
for n, ep, mb in ((1, 1, None), (8, 4, 8)):
    d = f"{sys.argv[1]}/{n}"
    train_rung(rung, d, TrainConfig(microbatch=mb, model=model, run=RunArgs(
        devices=n, expert_parallel=ep, peak_flops=1e11, progress=False)))
    rows = read_metrics(f"{d}/metrics.jsonl")
    out[n] = {"loss": [r["train/loss"] for r in rows], "gnorm": [r["grad/norm"] for r in rows],
              "bias": [r["params/norm/router_bias"] for r in rows],
              "drop": [r["moe/drop_frac"] for r in rows],
              "dropless": [r["eval_dropless/loss"] for r in rows if "eval_dropless/loss" in r],
              "mesh": read_json(f"{d}/config.json")["mesh"]}
# routed experts split over "expert" (E/4 = 1 row per device), dense weights FSDP over all 8
import model as M
from ladder.step import make_mesh, programs
state = programs(rung.model, make_mesh(8, 4, rung.model.n_experts, 8)).init_state(0)
groups = M.param_groups(state["params"])
out["routed_shard_rows"] = sorted({s.data.shape[0] for x in groups["routed_experts"]
                                   for s in x.addressable_shards})
out["embedding_shard"] = sorted({s.data.shape for s in groups["embedding"][0].addressable_shards})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_eight_device_expert_parallel_microbatched_matches_one_device(tmp_path):
    out = json.loads(run_on_fake_devices(SCRIPT, str(tmp_path)).strip().splitlines()[-1])
    one, eight = out["1"], out["8"]
    assert one["mesh"]["shape"] == {"data": 1, "expert": 1}
    assert eight["mesh"]["shape"] == {"data": 2, "expert": 4}
    assert (eight["mesh"]["microbatch"], eight["mesh"]["microbatches"]) == (8, 2)
    assert len(one["loss"]) == len(eight["loss"]) == 20
    for a, b in zip(one["loss"], eight["loss"], strict=True):
        assert b == pytest.approx(a, abs=1e-5)
    for a, b in zip(one["gnorm"], eight["gnorm"], strict=True):
        assert b == pytest.approx(a, rel=1e-4)
    for a, b in zip(one["bias"], eight["bias"], strict=True):   # the threshold rule's bias
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5)
    for a, b in zip(one["dropless"], eight["dropless"], strict=True):   # the ragged path
        assert b == pytest.approx(a, abs=1e-5)
    assert max(one["drop"] + eight["drop"]) == 0
    assert one["loss"][-1] < one["loss"][0] - 0.5          # it trained
    assert out["routed_shard_rows"] == [1]   # tiny has 4 experts: one per device of the axis
    assert out["embedding_shard"] == [[32, 16]]   # [256, 16] split 8 ways on the vocab axis
