"""The decoder and its functional API: forward/backward, exact parameter counts, causality, the
local window, RoPE, config validation."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ladder import model
from ladder.counting import count_params
from ladder.model.config import ModelConfig
from ladder.model.layers import Attention, materialize, rope
from ladder.specs import LADDERS

TINY = LADDERS["tiny"].rungs[0].model


@pytest.fixture(scope="module")
def tiny():
    params, bias = model.init(TINY, 0)
    return params, bias


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_tiny_forward_and_backward(tiny):
    params, bias = tiny
    B, S = 2, 16
    tokens = jax.random.randint(jax.random.key(0), (B, S), 0, TINY.vocab_size)
    grad_fn = jax.jit(jax.value_and_grad(partial(model.loss_fn, TINY), argnums=(0, 1),
                                         has_aux=True))
    (loss, stats), (g_params, g_bias) = grad_fn(params, bias + 0.1, tokens, jnp.roll(tokens, -1, 1))
    # at init the logits are small (the recipe's init: std ~0.5, which adds ~var/2 = 0.13 nats):
    # the loss is near log(vocab), uniform prediction
    assert 0 <= float(stats["ce"]) - math.log(TINY.vocab_size) < 0.25
    assert float(loss) == pytest.approx(float(stats["ce"] + stats["z_loss"]), rel=1e-6)
    assert float(stats["z_loss"]) > 0
    L, E = TINY.n_layers, TINY.n_experts
    assert stats["moe/load"].shape == stats["moe/bias_target"].shape == (L, E)
    np.testing.assert_array_equal(stats["moe/load"].sum(-1), [B * S * TINY.top_k] * L)
    for key in ("moe/drop_frac", "moe/load_max_over_mean", "moe/router_entropy",
                "moe/router_z_loss", "moe/balance_loss"):
        assert stats[key].shape == () and np.isfinite(stats[key]), key
    assert 0 <= float(stats["moe/drop_frac"]) < 1
    assert 0 < float(stats["moe/router_entropy"]) <= math.log(E) + 1e-6
    # the router bias is an input that gets exactly zero gradient; every param group learns
    np.testing.assert_array_equal(g_bias, np.zeros((L, E)))
    for group, leaves in model.param_groups(g_params).items():
        assert sum(float(jnp.abs(x).sum()) for x in leaves) > 0, group


@pytest.mark.heavy  # 16 s on 2 busy cores
@pytest.mark.parametrize("rung", [r for lad in ("tiny", "cpu") for r in LADDERS[lad].all],
                         ids=lambda r: f"{r.ladder}:{r.name}")
def test_counted_params_equal_instantiated(rung):
    cfg = rung.model
    params, bias = model.init(cfg, 0)
    counted = count_params(cfg)
    assert sum(x.size for x in jax.tree.leaves(params)) + bias.size == counted.total
    sizes = {g: sum(x.size for x in leaves) for g, leaves in model.param_groups(params).items()}
    L, E = cfg.n_layers, cfg.n_experts
    assert sizes == {
        "embedding": counted.embedding, "lm_head": counted.lm_head,
        "attention": counted.attention, "norms": counted.norms,
        "router": counted.router - L * E,  # counting.py includes the router bias [L, E]
        "latent": counted.latent, "shared_experts": counted.shared_experts,
        "routed_experts": counted.routed_experts,
    }


def test_one_scheme_of_parameter_groups():
    # the trainer's groups (metrics, optimizer) are the counter's, name for name
    import dataclasses

    from ladder.counting import ParamCount
    from ladder.model.transformer import PARAM_GROUPS
    fields = {f.name for f in dataclasses.fields(ParamCount)} - {"routed_active", "convention"}
    assert fields == set(PARAM_GROUPS)


def test_param_shapes_allocate_nothing_and_match_init(tiny):
    params, _ = tiny
    shapes, bias = model.param_shapes(TINY)
    assert jax.tree.map(lambda s: (s.shape, s.dtype), shapes) == \
        jax.tree.map(lambda x: (x.shape, x.dtype), params)
    assert bias.shape == (TINY.n_layers, TINY.n_experts)


def test_init_is_deterministic_and_seeded(tiny):
    params, _ = tiny
    again, _ = model.init(TINY, 0)
    other, _ = model.init(TINY, 1)
    flat, flat_again = jax.tree.leaves(params), jax.tree.leaves(again)
    assert all(np.array_equal(a, b) for a, b in zip(flat, flat_again, strict=True))
    assert not np.array_equal(params["embedding"], other["embedding"])
    assert float(jnp.std(params["embedding"])) == pytest.approx(TINY.weight_std, rel=0.1)
    np.testing.assert_array_equal(params["final_norm"]["scale"], np.ones(TINY.d_model))


@pytest.mark.heavy  # 5 s on 2 busy cores
@pytest.mark.parametrize("batch,dropless", [(1, False), (2, True)])
def test_causal(tiny, batch, dropless):
    # with drops, earlier tokens of the flattened batch win expert slots, so a future token cannot
    # change an earlier one's output within one sequence (B=1); across rows use dropless mode
    params, bias = tiny
    tokens = jax.random.randint(jax.random.key(1), (batch, 24), 0, TINY.vocab_size)
    changed = tokens.at[:, 10].set((tokens[:, 10] + 7) % TINY.vocab_size)
    fwd = jax.jit(lambda t: model.apply(TINY, params, bias, t, dropless=dropless)[0])
    a, b = fwd(tokens), fwd(changed)
    np.testing.assert_array_equal(a[:, :10], b[:, :10])
    assert not np.allclose(a[:, 10:], b[:, 10:])


def test_local_window_limits_attention():
    cfg = ModelConfig(vocab_size=16, d_model=16, n_layers=2, n_heads=4, head_dim=4,
                      n_kv_heads_local=2, n_kv_heads_global=1, local_window=4)
    assert not cfg.is_global(0) and cfg.is_global(1)
    x = jax.random.normal(jax.random.key(2), (1, 12, cfg.d_model))
    x2 = x.at[:, 3].add(1.0)                                   # perturb position 3
    for layer, affected in ((0, range(3, 7)), (1, range(3, 12))):
        attn = Attention(cfg, layer)
        params = materialize(jax.eval_shape(attn.init, jax.random.key(0), x)["params"], 0)
        f = jax.jit(lambda p, x, a=attn: a.apply({"params": p}, x))
        diff = np.abs(np.asarray(f(params, x2) - f(params, x))).max(axis=-1)[0]   # [S]
        changed = {s for s in range(12) if diff[s] > 1e-6}
        assert changed == set(affected), (layer, changed)


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_rope_scores_depend_on_relative_position_only():
    q = jax.random.normal(jax.random.key(3), (1, 8, 1, 8))
    k = jax.random.normal(jax.random.key(4), (1, 8, 1, 8))
    pos = jnp.arange(8)

    def scores(shift):
        rotated_q, rotated_k = rope(q, pos + shift, 8, 1e4), rope(k, pos + shift, 8, 1e4)
        return jnp.einsum("bshx,bthx->st", rotated_q, rotated_k)

    np.testing.assert_allclose(scores(0), scores(13), rtol=1e-4, atol=1e-5)
    assert not np.allclose(scores(0), jnp.einsum("bshx,bthx->st", q, k), atol=1e-3)
    partial_rot = rope(q, pos, 4, 1e4)                         # rope_fraction 0.5 of head dim 8
    np.testing.assert_array_equal(partial_rot[..., 4:], q[..., 4:])
    np.testing.assert_array_equal(partial_rot[:, 0], q[:, 0])  # position 0: angle 0


@pytest.mark.parametrize("override,field", [
    ({"top_k": 9}, "top_k"),                 # top_k > n_experts (8)
    ({"d_model": 30}, "d_model"),            # not divisible by n_heads (4)
    ({"capacity_factor": 0.0}, "capacity_factor"),
    ({"capacity_factor": -1.0}, "capacity_factor"),
    ({"n_kv_heads_local": 3}, "n_kv_heads_local"),
    ({"combine": "argmax"}, "combine"),
    ({"bias_rule": "aux_loss"}, "bias_rule"),
    ({"rope_fraction": 1.5}, "rope_fraction"),
    ({"n_experts": 0}, "n_experts"),
])
def test_invalid_config_names_the_field(override, field):
    base = {"vocab_size": 16, "d_model": 32, "n_layers": 2, "n_heads": 4, "head_dim": 8,
            "n_kv_heads_local": 2, "n_kv_heads_global": 1, "n_experts": 8, "top_k": 2}
    ModelConfig(**base)
    with pytest.raises(ValueError, match=f"^{field}:"):
        ModelConfig(**{**base, **override})
