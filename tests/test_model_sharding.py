"""The model under a (data x expert) device mesh matches one device (8 host CPU devices): under
``jax.set_mesh`` the MoE layers run expert-parallel (shard_map + all_to_all)."""

import textwrap

import pytest
from conftest import EXPERT_MESH_SRC, run_on_fake_devices

SCRIPT = EXPERT_MESH_SRC + textwrap.dedent("""
    import os
    import jax, jax.numpy as jnp, numpy as np
    from functools import partial
    from jax.sharding import PartitionSpec as P
    from ladder.specs import LADDERS
    from ladder import model
    assert jax.device_count() == 8
    # drops on (capacity factor 1.25) with cells of one sequence (32 tokens here): each device
    # holds whole cells, so the expert-parallel path drops what one device drops (issue 22)
    cfg = LADDERS["tiny"].rungs[0].model.replace(n_experts=8, capacity_tokens=32,
                                                 capacity_factor=1.25, remat=os.environ["REMAT"])
    assert cfg.capacity_factor == 1.25
    params, bias = model.init(cfg, 0)
    tokens = jax.random.randint(jax.random.key(1), (8, 32), 0, cfg.vocab_size)   # 1 per device
    step = jax.jit(jax.value_and_grad(partial(model.loss_fn, cfg), has_aux=True))
    (loss1, st1), grads1 = step(params, bias, tokens, tokens)
    assert float(st1["moe/drop_frac"]) > 0

    # "Auto" axes: routed experts split on "expert", batch over data x expert, the rest replicated
    mesh, sharded, toks = on_expert_mesh(params, tokens)
    with jax.set_mesh(mesh):
        (loss8, st8), grads8 = step(sharded, bias, toks, toks)
        hlo = step.lower(sharded, bias, toks, toks).compile().as_text()
    assert "all-to-all" in hlo
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    assert float(st8["moe/drop_frac"]) == float(st1["moe/drop_frac"])
    for a, b in zip(jax.tree.leaves(grads8), jax.tree.leaves(grads1)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    g = grads8["layer_0"]["moe"]["experts"]["gate"]
    assert g.sharding.spec == P("expert"), g.sharding
    print("ok")
""")


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["none", "full"])
def test_data_expert_mesh_matches_one_device(remat, monkeypatch):
    """With remat the routed path's gradient comes from moe.recompute_at_backward: the same."""
    monkeypatch.setenv("REMAT", remat)
    assert run_on_fake_devices(SCRIPT).strip().endswith("ok")
