"""Sharded init: each process draws only its devices' shards of every parameter, and the values
are model.init's exactly (bitwise), on 1 device and on 8 fake devices under every mesh split,
with the gpt2 init and the recipe's truncated normal (whose redraws need the whole stream)."""

import json

import numpy as np
import pytest
from conftest import run_on_fake_devices
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import draw_normal

from ladder.model.layers import draw_normal_regions


@st.composite
def _shape_and_regions(draw):
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    regions = []
    for _ in range(draw(st.integers(1, 4))):
        r = []
        for n in shape:
            a = draw(st.integers(0, n - 1))
            r.append((a, draw(st.integers(a + 1, n))))
        regions.append(tuple(r))
    return shape, regions


@settings(max_examples=200, deadline=None)
@given(sr=_shape_and_regions(), truncate=st.sampled_from([None, 3.0, 1.0, 0.2]),
       chunk=st.integers(1, 64), seed=st.integers(0, 2**32 - 1))
def test_regions_equal_the_whole_draw_sliced(sr, truncate, chunk, seed):
    """Truncation at 0.2 sigma redraws most values several times: every redraw round is hit."""
    shape, regions = sr
    whole = draw_normal(seed, ("a", "b"), shape, 0.02, truncate)
    got = draw_normal_regions(seed, ("a", "b"), shape, 0.02, truncate, regions, chunk=chunk)
    for r, g in zip(regions, got):
        want = whole[tuple(slice(a, b) for a, b in r)]
        assert g.dtype == np.float32 and np.array_equal(g, want)


def compare_with_model_init() -> dict:
    """On every visible device: model.init's values beside init_sharded's, with the trainer's
    shardings (the largest expert axis), for the gpt2 init and the recipe's truncated normal on
    5 layers (2 scanned groups: stacked parameters, + 1 unrolled)."""
    import jax
    from flax.traverse_util import flatten_dict

    import ladder.model as M
    from ladder.specs import LADDERS
    from ladder.trainer.optim import OptimizerSpec
    from ladder.trainer.step import make_mesh, make_optimizer, state_shardings

    n = len(jax.devices())
    base = LADDERS["tiny"].rungs[0].model.replace(init="gpt2")
    adamw = make_optimizer(OptimizerSpec().settings(1.0, 1, 1))
    out = {}
    for name, cfg in (("gpt2", base), ("recipe", base.replace(init="recipe", n_layers=5,
                                                             global_every=2))):
        ref = {k: np.asarray(v) for k, v in flatten_dict(M.init(cfg, 3)[0]).items()}
        ep = max(e for e in range(1, n + 1) if n % e == 0 and cfg.n_experts % e == 0)
        shardings = state_shardings(cfg, adamw, make_mesh(n, ep, cfg.n_experts, n))["params"]
        got = flatten_dict(M.init_sharded(cfg, 3, shardings)[0])
        out[name] = {
            "same": all(np.array_equal(np.asarray(got[k]), v) for k, v in ref.items()),
            "placed": all(got[k].sharding == s for k, s in flatten_dict(shardings).items()),
            # leaves that no device holds whole
            "split": sum(x.addressable_shards[0].data.size < x.size for x in got.values()),
            "leaves": len(ref), "devices": n}
    return out


SCRIPT = r"""
import json, sys
sys.path.insert(0, "tests")
from test_init_sharded import compare_with_model_init
print(json.dumps(compare_with_model_init()))
"""


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_init_sharded_has_model_init_values_on_one_device():
    out = compare_with_model_init()
    assert set(out) == {"gpt2", "recipe"}
    assert all(v["same"] and v["placed"] for v in out.values()), out


@pytest.mark.heavy  # 13 s on 2 busy cores
def test_init_sharded_has_model_init_values_on_eight_devices():
    out = json.loads(run_on_fake_devices(SCRIPT, devices=8).strip().splitlines()[-1])
    assert set(out) == {"gpt2", "recipe"} and all(v["devices"] == 8 for v in out.values())
    assert all(v["same"] and v["placed"] for v in out.values()), out
    assert all(v["split"] > v["leaves"] // 2 for v in out.values()), out


def test_the_trainer_starts_from_model_init():
    import jax
    from flax.traverse_util import flatten_dict

    import ladder.model as M
    from ladder.specs import LADDERS
    from ladder.trainer.step import make_mesh, programs

    cfg = LADDERS["tiny"].rungs[0].model
    state = programs(cfg, make_mesh(1, 1, cfg.n_experts, 1)).init_state(5)
    ref = flatten_dict(M.init(cfg, 5)[0])
    got = flatten_dict(state["params"])
    assert set(got) == set(ref) and len(jax.devices()) >= 1
    assert all(np.array_equal(np.asarray(got[k]), np.asarray(v)) for k, v in ref.items())
