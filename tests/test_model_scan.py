"""Layers under nn.scan: the parameter layout, the same function as running the layers one by one,
remat policies that change nothing but memory, a program that does not grow with depth, and the
trainer's shardings and weight-decay mask on the stacked layout."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from ladder import model
from ladder.counting import count_params
from ladder.model.config import ModelConfig
from ladder.model.layers import rms_norm
from ladder.model.transformer import Block, expert_axis, param_group

# 10 layers, a global one every 4th: 2 scanned groups of [L, L, L, G] + layers 8 (L), 9 (G)
CFG = ModelConfig(vocab_size=32, d_model=16, n_layers=10, n_heads=2, head_dim=8,
                  n_kv_heads_local=2, n_kv_heads_global=1, local_window=4, n_experts=4, top_k=2,
                  expert_dim=8, latent_dim=8, shared_dim=8, precision="f32")


@pytest.fixture(scope="module")
def init10():
    params, bias = model.init(CFG, 0)
    bias = jax.random.normal(jax.random.key(9), bias.shape)   # a different bias per layer
    return params, bias


def test_layout(init10):
    params, bias = init10
    flat = flatten_dict(params)
    assert CFG.n_groups == 2 and CFG.scanned_layers == 8
    assert set(params) == {"embedding", "lm_head", "final_norm", "groups", "layer_8", "layer_9"}
    assert set(params["groups"]) == {f"block_{j}" for j in range(4)}
    gate = ("moe", "experts", "gate")
    assert flat[("groups", "block_0") + gate].shape == (2, 4, 8, 8)      # [G, E, L, F]
    assert flat[("layer_8",) + gate].shape == (4, 8, 8)                  # [E, L, F]
    # global layers (block_3, layer_9) have 1 KV head, local ones 2
    assert flat[("groups", "block_3", "attn", "k")].shape == (2, 16, 1, 8)
    assert flat[("groups", "block_2", "attn", "k")].shape == (2, 16, 2, 8)
    assert flat[("layer_8", "attn", "k")].shape == (16, 2, 8)
    assert flat[("layer_9", "attn", "k")].shape == (16, 1, 8)
    for path, x in flat.items():
        if param_group(path) == "routed_experts":
            assert x.shape[expert_axis(path)] == CFG.n_experts, path
    counted = count_params(CFG)
    assert sum(x.size for x in jax.tree.leaves(params)) + bias.size == counted.total
    sizes = {g: sum(x.size for x in v) for g, v in model.param_groups(params).items()}
    assert sizes["routed_experts"] == counted.routed_experts
    assert sizes["attention"] == counted.attention
    assert sizes["norms"] == counted.norms


def _layer_params(params, i):
    """Layer i's parameters, sliced out of the stacked groups when it is scanned."""
    if i < CFG.scanned_layers:
        g, j = divmod(i, CFG.global_every)
        return jax.tree.map(lambda x: x[g], params["groups"][f"block_{j}"])
    return params[f"layer_{i}"]


def _unrolled_apply(params, bias, tokens):
    """The decoder written as a plain loop over layers (the layout undone by hand)."""
    x = jnp.take(params["embedding"], tokens, axis=0)
    auxes = []
    for i in range(CFG.n_layers):
        x, aux = Block(CFG, i, True).apply({"params": _layer_params(params, i)}, x, bias[i])
        auxes.append(aux)
    x = rms_norm(x, params["final_norm"]["scale"], CFG.norm_eps)
    logits = jnp.einsum("bsd,dv->bsv", x, params["lm_head"])
    return logits, {k: jnp.stack([a[k] for a in auxes]) for k in auxes[0]}


def test_scan_equals_layer_loop(init10):
    params, bias = init10
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, CFG.vocab_size)
    logits, aux = jax.jit(partial(model.apply, CFG, dropless=True))(params, bias, tokens)
    ref_logits, ref_aux = jax.jit(_unrolled_apply)(params, bias, tokens)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
    for k, v in ref_aux.items():
        assert aux[k].shape == v.shape and aux[k].shape[0] == CFG.n_layers, k
        np.testing.assert_allclose(aux[k], v, rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.heavy  # 11 s on 2 busy cores
def test_remat_changes_nothing_but_memory():
    # one scanned group [L, G] and one unrolled layer: both paths, the fewest blocks to compile
    base = CFG.replace(n_layers=3, global_every=2)
    params, bias = model.init(base, 0)
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, CFG.vocab_size)
    results = {}
    for remat in ("none", "dots", "full"):
        cfg = base.replace(remat=remat)
        f = jax.jit(jax.value_and_grad(partial(model.loss_fn, cfg), has_aux=True))
        (loss, stats), grads = f(params, bias, tokens, jnp.roll(tokens, -1, 1))
        results[remat] = (loss, stats["moe/load"], grads)
    loss0, load0, grads0 = results["none"]
    for remat in ("dots", "full"):
        loss, load, grads = results[remat]
        np.testing.assert_allclose(loss, loss0, rtol=1e-6)
        np.testing.assert_array_equal(load, load0)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_program_does_not_grow_with_depth():
    # a proxy for compile time that can be asserted: the lowered program (StableHLO text) of the
    # training gradient at 24 layers is about the size of the one at 8 (unrolled: 3x)
    def program_size(n_layers):
        cfg = CFG.replace(n_layers=n_layers, remat="dots")
        params, bias = model.param_shapes(cfg)
        tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
        f = jax.jit(jax.grad(lambda p, b, t: model.loss_fn(cfg, p, b, t, t)[0]))
        return len(f.lower(params, bias, tokens).as_text())

    assert program_size(24) < 1.1 * program_size(8)


def test_trainer_shardings_and_decay_mask_on_stacked_layout():
    from jax.sharding import PartitionSpec as P

    from ladder.trainer.optim import OptimizerSpec
    from ladder.trainer.step import make_mesh, make_optimizer, state_shardings

    optimizer = make_optimizer(OptimizerSpec("adamw").settings(1e-3, 1.0, 1))
    shard = state_shardings(CFG, optimizer, make_mesh(1, 1, CFG.n_experts, 2))
    flat = flatten_dict(shard["params"])
    gate = ("moe", "experts", "gate")

    def spec(path):  # trailing None axes are implied: P(None, "expert", None) == P(None, "expert")
        parts = list(flat[path].spec)
        while parts and parts[-1] is None:
            parts.pop()
        return P(*parts)

    assert spec(("groups", "block_1") + gate) == P(None, "expert")
    assert spec(("layer_9",) + gate) == P("expert")
    assert spec(("groups", "block_1", "attn", "q")) == P()
    # AdamW decays matrices only: a stacked norm scale [G, D] is 2-D but not a matrix
    params, _ = model.init(CFG, 0)
    grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)
    flat_u = flatten_dict(updates)
    assert float(jnp.abs(flat_u[("groups", "block_0", "attn_norm", "scale")]).max()) == 0
    assert float(jnp.abs(flat_u[("layer_8", "moe_norm", "scale")]).max()) == 0
    assert float(jnp.abs(flat_u[("groups", "block_0", "attn", "q")]).max()) > 0
    assert float(jnp.abs(flat_u[("layer_8", "attn", "q")]).max()) > 0


SHARDED = """
import jax, jax.numpy as jnp, numpy as np
from functools import partial
from jax.sharding import NamedSharding, PartitionSpec as P
from flax.traverse_util import flatten_dict
from ladder import model
from ladder.trainer.optim import OptimizerSpec
from ladder.trainer.step import make_mesh, make_optimizer, state_shardings
from ladder.model.config import ModelConfig
assert jax.device_count() == 8
cfg = ModelConfig(vocab_size=32, d_model=16, n_layers=5, n_heads=2, head_dim=8,
                  n_kv_heads_local=2, n_kv_heads_global=1, local_window=4, n_experts=8, top_k=2,
                  expert_dim=8, latent_dim=8, shared_dim=8, precision="f32",
                  capacity_factor=8.0)   # no drops: capacity per (sender shard, expert) cell
                                         # and over the whole batch then keep the same tokens
params, bias = model.init(cfg, 0)
tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, cfg.vocab_size)
step = jax.jit(jax.value_and_grad(partial(model.loss_fn, cfg), has_aux=True))
(loss1, _), grads1 = step(params, bias, tokens, tokens)
mesh = make_mesh(8, 4, cfg.n_experts, 8)   # the batch is split over all 8 devices
shard = state_shardings(cfg, make_optimizer(OptimizerSpec("adamw").settings(1e-3, 1.0, 1)), mesh)
with jax.set_mesh(mesh):
    p8 = jax.device_put(params, shard["params"])
    toks = jax.device_put(tokens, NamedSharding(mesh, P(("data", "expert"))))
    (loss8, _), grads8 = step(p8, bias, toks, toks)
np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
for a, b in zip(jax.tree.leaves(grads8), jax.tree.leaves(grads1), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
g = flatten_dict(grads8)[("groups", "block_0", "moe", "experts", "gate")]
assert g.shape == (1, 8, 8, 8) and g.sharding.spec == P(None, "expert"), g.sharding
print("ok")
"""


@pytest.mark.slow
def test_stacked_layout_on_a_data_expert_mesh_matches_one_device():
    from conftest import run_on_fake_devices
    assert run_on_fake_devices(SHARDED).strip().endswith("ok")
