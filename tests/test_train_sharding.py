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
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import RunArgs, TrainConfig
import jax
assert len(jax.devices()) == 8, jax.devices()
# batch 16 so that a microbatch of 8 puts one sequence on each of the 8 devices. Drops on (capacity
# factor 1.25): capacity is counted per cell of one sequence (tiny's capacity_tokens), which
# every layout here holds whole, so all of them compute the same function (issue 22 item 2)
rung = LADDERS["tiny"].rungs[0].replace(batch=16, steps=20)
rung = rung.replace(model=rung.model.replace(capacity_factor=1.25))
assert rung.model.capacity_tokens == rung.seq_len and rung.model.capacity_factor == 1.25
out = {}
for n, ep, mb in ((1, 1, None), (1, 1, 4), (8, 4, 8), (8, 2, None)):
    name = f"{n}-{ep}-{mb}"
    d = f"{sys.argv[1]}/{name}"
    train_rung(rung, d, TrainConfig(microbatch=mb, run=RunArgs(
        devices=n, expert_parallel=ep, peak_flops=1e11, progress=False)))
    rows = read_metrics(f"{d}/metrics.jsonl")
    out[name] = {"loss": [r["train/loss"] for r in rows], "gnorm": [r["grad/norm"] for r in rows],
                 "bias": [r["params/norm/router_bias"] for r in rows],
                 "drop": [r["moe/drop_frac"] for r in rows],
                 "eval": [r["eval/loss"] for r in rows if "eval/loss" in r],
                 "dropless": [r["eval_dropless/loss"] for r in rows
                              if "eval_dropless/loss" in r],
                 "mesh": read_json(f"{d}/config.json")["mesh"]}
# routed experts split over "expert" (E/4 = 1 row per device), dense weights FSDP over all 8
import ladder.model as M
from ladder.trainer.step import make_mesh, programs
state = programs(rung.model, make_mesh(8, 4, rung.model.n_experts, 8)).init_state(0)
groups = M.param_groups(state["params"])
out["routed_shard_rows"] = sorted({s.data.shape[0] for x in groups["routed_experts"]
                                   for s in x.addressable_shards})
out["embedding_shard"] = sorted({s.data.shape for s in groups["embedding"][0].addressable_shards})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_eight_device_expert_parallel_microbatched_matches_one_device(tmp_path):
    """1 device, 1 device in 4 microbatches, 8 devices (2 data x 4 expert) in 2 microbatches and
    8 devices (4 x 2) whole: the same 20 steps with drops on, to 1e-4 in loss (issue 22)."""
    out = json.loads(run_on_fake_devices(SCRIPT, str(tmp_path)).strip().splitlines()[-1])
    one = out["1-1-None"]
    assert one["mesh"]["shape"] == {"data": 1, "expert": 1}
    assert out["8-4-8"]["mesh"]["shape"] == {"data": 2, "expert": 4}
    assert (out["8-4-8"]["mesh"]["microbatch"], out["8-4-8"]["mesh"]["microbatches"]) == (8, 2)
    assert out["1-1-4"]["mesh"]["microbatches"] == 4
    assert out["8-2-None"]["mesh"]["shape"] == {"data": 4, "expert": 2}
    assert max(one["drop"]) > 0.01                        # the comparison covers dropping
    for name in ("1-1-4", "8-4-8", "8-2-None"):
        other = out[name]
        assert len(other["loss"]) == len(one["loss"]) == 20
        for key, tol in (("loss", 1e-4), ("eval", 1e-4), ("dropless", 1e-4)):
            assert len(other[key]) == len(one[key]) > 0
            for a, b in zip(one[key], other[key], strict=True):
                assert b == pytest.approx(a, abs=tol), (name, key)
        for a, b in zip(one["gnorm"], other["gnorm"], strict=True):
            assert b == pytest.approx(a, rel=1e-4), name
        for a, b in zip(one["bias"], other["bias"], strict=True):   # the threshold rule's bias
            assert b == pytest.approx(a, rel=1e-4, abs=1e-5), name
        for a, b in zip(one["drop"], other["drop"], strict=True):   # the same drops
            assert b == pytest.approx(a, abs=1e-6), name
    assert one["loss"][-1] < one["loss"][0] - 0.5          # it trained
    assert out["routed_shard_rows"] == [1]   # tiny has 4 experts: one per device of the axis
    assert out["embedding_shard"] == [[32, 16]]   # [256, 16] split 8 ways on the vocab axis
