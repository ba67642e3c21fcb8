"""The balancing bias with the router's own step taken off (issue 37 item 6), and the marin
optimizer's objection to an init it does not train well from.

The threshold and quantile rules set the next step's bias from this step's logits, but the next
step routes with the updated router. Where one optimizer step moves an expert's logits further
than their spread over tokens, every token then picks the same experts (the tiny ladder at its
peak LR: 10-30 steps with one expert taking every token, before this)."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import draw_normal

from ladder import model
from ladder.model.config import ModelConfig
from ladder.model.moe import moe_stats, route, update_router_bias
from ladder.model.transformer import router_weights
from ladder.specs import LADDERS
from ladder.trainer.optim import init_warning, warn_init


def small_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=64, d_model=16, n_layers=2, n_heads=2, head_dim=8,
                n_kv_heads_local=1, n_kv_heads_global=1, n_experts=8, top_k=2)
    return ModelConfig(**{**base, **kw})


def test_drift_correction_hand_computed():
    # x_mean = (1, 2); the step raises expert 0's weight on dim 0 by 0.1 and expert 1's on dim 1
    # by 0.3: logits move by (0.1, 0.6, 0) on the mean token, centred (-0.1333, 0.3667, -0.2333)
    target = jnp.array([[0.5, 0.0, -0.5]])
    stats = {"moe/bias_target": target, "moe/router_in": jnp.array([[1.0, 2.0]]),
             "moe/load": jnp.ones((1, 3))}
    step = jnp.array([[[0.1, 0.0, 0.0], [0.0, 0.3, 0.0]]])               # [L, D, E]
    for rule in ("threshold", "quantile"):
        cfg = small_cfg(n_experts=3, top_k=1, bias_rule=rule)
        got = update_router_bias(cfg, jnp.zeros((1, 3)), stats, step)
        np.testing.assert_allclose(got, [[0.5 + 0.1 / 3 + 0.1, -0.6 + 0.7 / 3, -0.5 + 0.7 / 3]],
                                   rtol=1e-6)
        np.testing.assert_array_equal(update_router_bias(cfg, jnp.zeros((1, 3)), stats), target)
    # the sign rule moves by load only
    cfg = small_cfg(n_experts=3, top_k=1, bias_rule="sign")
    np.testing.assert_array_equal(update_router_bias(cfg, jnp.zeros((1, 3)), stats, step),
                                  jnp.zeros((1, 3)))


def _drifting(correct: bool, steps: int = 40):
    """Tokens x = mu + small noise (a common direction, as a residual stream has); each step the
    router moves expert 0's weights by lr * sign(mu) (an Adam step whose gradient follows the
    common direction), so expert 0's logit rises by lr |mu|_1 on every token: more than the
    logits' spread over tokens. Returns the max/mean load of each step."""
    D, E, T, lr = 16, 8, 2048, 0.02
    cfg = small_cfg(d_model=D, n_experts=E, bias_rule="threshold")
    mu = jax.random.normal(jax.random.key(0), (D,))
    w0 = 0.02 * jax.random.normal(jax.random.key(1), (D, E))
    dw = jnp.zeros((D, E)).at[:, 0].set(lr * jnp.sign(mu))

    def step(carry, key):
        w, bias = carry
        x = mu + 0.3 * jax.random.normal(key, (T, D))
        logits = x @ w
        r = route(cfg, logits, bias[0])
        s = moe_stats(cfg, logits, r, jnp.ones_like(r.expert, bool))
        stats = {"moe/load": s["load"][None], "moe/bias_target": s["bias_target"][None],
                 "moe/router_in": jnp.mean(x, axis=0)[None]}
        bias = update_router_bias(cfg, bias, stats, dw[None] if correct else None)
        return (w + dw, bias), jnp.max(s["load"]) / jnp.mean(s["load"])

    keys = jax.random.split(jax.random.key(2), steps)
    return np.asarray(jax.lax.scan(step, (w0, jnp.zeros((1, E))), keys)[1])


def test_drift_correction_keeps_a_drifting_router_balanced():
    lagged, corrected = _drifting(False), _drifting(True)
    # the lagged bias: expert 0 takes (nearly) every token (max/mean -> E / k = 4) until its
    # weights, grown by the drift, spread its logits wider than one step moves them
    assert np.all(lagged[1:6] > 3.9) and lagged[1:11].mean() > 3.5, lagged
    # taking the step off keeps it near balance from the start
    assert np.all(corrected[1:] < 1.5), corrected


@pytest.mark.parametrize("n_layers,global_every", [(2, 4), (4, 4), (5, 2)])
def test_router_weights_in_layer_order(n_layers, global_every):
    # slice l is the router layer l is drawn as when unrolled (model.init's own rule)
    cfg = small_cfg(n_layers=n_layers, global_every=global_every)
    params, _ = model.init(cfg, 3)
    w = np.asarray(router_weights(cfg, params))
    assert w.shape == (n_layers, cfg.d_model, cfg.n_experts)
    for layer in range(n_layers):
        want = draw_normal(3, (f"layer_{layer}", "moe", "router"),
                           (cfg.d_model, cfg.n_experts), cfg.weight_std, None)
        np.testing.assert_allclose(w[layer], want, rtol=1e-6)


def test_marin_optimizer_warns_on_an_init_it_does_not_train_from():
    tiny = LADDERS["tiny"].rungs[0].model.replace(init="gpt2")      # std 0.02 at d=16
    cpu = LADDERS["cpu"].rungs[0].model                             # the recipe's init
    msg = init_warning("marin", tiny)
    assert msg is not None and "--model.init=recipe" in msg and "0.16x" in msg
    assert init_warning("marin", cpu) is None
    assert init_warning("adamw", tiny) is None
    # --model.init_std at the recipe's scale (docs/LOG.md's workaround) is accepted
    assert init_warning("marin", tiny.replace(init_std=0.5 / math.sqrt(16))) is None
    with pytest.warns(UserWarning, match="optimizer marin"):
        warn_init("marin", tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_init("marin", cpu)
