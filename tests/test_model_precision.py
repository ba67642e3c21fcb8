"""Mixed precision and the chunked LM head: bf16 matmuls with float32 masters, router and loss;
"auto" resolves per backend; the chunked cross-entropy equals the whole-logits one and never
builds the [B, S, V] logits."""

from functools import partial

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from ladder import model
from ladder.io import InputError
from ladder.model.config import ModelConfig, resolve_precision
from ladder.specs import LADDERS
from ladder.trainer.trainconfig import TrainConfig, resolve_rung

# 5 layers: one scanned group of 4 and an unrolled last layer, so both code paths are covered
CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=5, n_heads=4, head_dim=8,
                  n_kv_heads_local=2, n_kv_heads_global=1, local_window=8, n_experts=4, top_k=2,
                  expert_dim=16, latent_dim=16, shared_dim=16, precision="f32")


@pytest.fixture(scope="module")
def init5():
    return model.init(CFG, 0)


def _tokens(key, B=2, S=24):
    t = jax.random.randint(jax.random.key(key), (B, S + 1), 0, CFG.vocab_size)
    return t[:, :-1], t[:, 1:]


def test_resolve_precision_and_rung():
    assert resolve_precision("auto", "cpu") == "f32"
    assert resolve_precision("auto", "gpu") == resolve_precision("auto", "tpu") == "bf16"
    assert resolve_precision("f32", "gpu") == "f32"
    rung = LADDERS["tiny"].rungs[0]
    assert rung.model.precision == "auto"
    assert resolve_rung(rung, TrainConfig()).model.precision == "f32"    # CPU here
    assert resolve_rung(rung, TrainConfig(model={"precision": "bf16"})).model.precision == "bf16"
    with pytest.raises(InputError) as e:
        resolve_rung(rung, TrainConfig(model={"precision": "fp16"}))
    assert "model.precision" in str(e.value)


@pytest.mark.parametrize("override,field", [({"precision": "fp8"}, "precision"),
                                            ({"remat": "some"}, "remat"),
                                            ({"loss_chunk": 0}, "loss_chunk")])
def test_invalid_compute_config_names_the_field(override, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        CFG.replace(**override)


@pytest.mark.heavy  # 16 s on 2 busy cores
def test_auto_is_f32_on_cpu_bitwise(init5):
    params, bias = init5
    tokens, targets = _tokens(1)
    def loss(cfg):
        return jax.jit(partial(model.loss_fn, cfg))(params, bias, tokens, targets)[0]
    f32, auto = loss(CFG), loss(CFG.replace(precision="auto"))
    np.testing.assert_array_equal(f32, auto)


def _dots(cfg, params, bias, tokens, targets):
    jaxpr = jax.make_jaxpr(partial(model.loss_fn, cfg))(params, bias, tokens, targets)
    out = []

    def walk(jp):
        for eqn in jp.eqns:
            if eqn.primitive.name == "dot_general":
                out.append(tuple(v.aval for v in eqn.invars))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)
    walk(jaxpr.jaxpr)
    return out


def test_bf16_matmuls_float32_router(init5):
    params, bias = init5
    tokens, targets = _tokens(2)
    dots = _dots(CFG.replace(precision="bf16"), params, bias, tokens, targets)
    f32 = [(a.shape, b.shape) for a, b in dots if a.dtype == jnp.float32]
    bf16 = [d for d in dots if d[0].dtype == d[1].dtype == jnp.bfloat16]
    # the only float32 matmuls are the routers (x [T, D] . w [D, E], one per layer)
    assert f32 and all(b == (CFG.d_model, CFG.n_experts) for _, b in f32), f32
    assert len(f32) == CFG.n_layers
    assert len(bf16) > 5 * CFG.n_layers
    assert all(a.dtype in (jnp.bfloat16, jnp.float32) for d in dots for a in d)
    assert all(a.dtype == jnp.float32 for d in _dots(CFG, params, bias, tokens, targets)
               for a in d)


@pytest.mark.heavy  # 73 s on 2 busy cores
def test_bf16_close_to_f32_with_float32_grads(init5):
    params, bias = init5
    tokens, targets = _tokens(3)
    out = {}
    for p in ("f32", "bf16"):
        f = jax.jit(jax.value_and_grad(partial(model.loss_fn, CFG.replace(precision=p)),
                                       has_aux=True))
        out[p] = f(params, bias, tokens, targets)
    (l32, s32), g32 = out["f32"]
    (l16, s16), g16 = out["bf16"]
    assert l16.dtype == jnp.float32 and s16["ce"].dtype == jnp.float32
    np.testing.assert_allclose(l16, l32, rtol=1e-2)
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(g16))
    # gradients agree in direction: bf16 rounding, not a different function
    a = jnp.concatenate([g.ravel() for g in jax.tree.leaves(g32)])
    b = jnp.concatenate([g.ravel() for g in jax.tree.leaves(g16)])
    assert float(a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b))) > 0.99
    logits16 = jax.eval_shape(partial(model.apply, CFG.replace(precision="bf16")), params, bias,
                              tokens)[0]
    assert logits16.dtype == jnp.float32


def _whole_logits_loss(cfg, params, bias, tokens, targets):
    """The loss from apply's whole [B, S, V] logits: the definition the chunked one must meet."""
    logits, _ = model.apply(cfg, params, bias, tokens)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - target) + cfg.z_loss * jnp.mean(lse ** 2)


@pytest.fixture(scope="module")
def whole():
    """The chunked head's reference on one unrolled layer: the layers below the head are not
    what is compared, and one layer compiles in a fraction of five's time."""
    cfg = CFG.replace(n_layers=1, z_loss=1e-2)   # a z-loss large enough to matter
    params, bias = model.init(cfg, 0)
    tokens, targets = _tokens(4)
    return cfg, params, bias, tokens, targets, jax.jit(jax.value_and_grad(
        partial(_whole_logits_loss, cfg)))(params, bias, tokens, targets)


@pytest.mark.heavy  # 30 s on 2 busy cores
@pytest.mark.parametrize("chunk", [8, 7, 512])   # 3 chunks, 4 (the last padded), one (clipped)
def test_chunked_loss_and_grads_equal_whole(whole, chunk):
    cfg, params, bias, tokens, targets, (ref, ref_g) = whole
    cfg = cfg.replace(loss_chunk=chunk)
    (loss, stats), grads = jax.jit(jax.value_and_grad(partial(model.loss_fn, cfg),
                                                      has_aux=True))(params, bias, tokens, targets)
    np.testing.assert_allclose(loss, ref, rtol=1e-6)
    np.testing.assert_allclose(stats["ce"] + stats["z_loss"], loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_g), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)


def test_loss_fn_never_builds_whole_logits(init5):
    params, bias = init5
    B, S, V = 2, 24, CFG.vocab_size
    tokens, targets = _tokens(5, B, S)

    def shapes(f):
        jaxpr = jax.make_jaxpr(f)(params)
        found = set()

        def walk(jp):
            for eqn in jp.eqns:
                found.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    walk(sub)
        walk(jaxpr.jaxpr)
        return found

    cfg = CFG.replace(loss_chunk=8)
    grad = jax.grad(lambda p: model.loss_fn(cfg, p, bias, tokens, targets)[0])
    assert (B, S, V) not in shapes(grad)
    assert (B, 8, V) in shapes(grad)
    assert (B, S, V) in shapes(lambda p: model.apply(cfg, p, bias, tokens)[0])   # the check bites
