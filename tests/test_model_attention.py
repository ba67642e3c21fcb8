"""Attention through jax.nn.dot_product_attention: equal to the dense reference (GQA, local
window, segments), and segments isolate packed documents in the whole model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_documents_stay_apart, attend_reference

from ladder import model
from ladder.model.layers import attend
from ladder.specs import LADDERS

TINY = LADDERS["tiny"].rungs[0].model


def _segments(B, S, key):
    """Random segment ids [B, S]: non-decreasing runs, as packing documents yields."""
    starts = jax.random.bernoulli(key, 0.2, (B, S)).at[:, 0].set(False)
    return jnp.cumsum(starts, axis=1).astype(jnp.int32)


@pytest.mark.heavy  # 25 s on 2 busy cores
@pytest.mark.parametrize("heads,kv_heads,window,segmented,chunk", [
    (4, 4, None, False, None), (4, 2, None, True, None), (4, 2, 5, False, None),
    (6, 1, 5, True, None), (6, 1, 1, True, None),
    # query blocks (the path without flash attention): whole blocks, a padded last block
    (4, 2, None, True, 5), (4, 2, 5, True, 8), (6, 1, 7, False, 4), (6, 1, 1, True, 8)])
def test_attend_matches_dense_reference(heads, kv_heads, window, segmented, chunk):
    B, S, Hd = 2, 20, 8
    kq, kk, kv, ks = jax.random.split(jax.random.key(heads * 10 + kv_heads), 4)
    q = jax.random.normal(kq, (B, S, heads, Hd))
    k = jax.random.normal(kk, (B, S, kv_heads, Hd))
    v = jax.random.normal(kv, (B, S, kv_heads, Hd))
    seg = _segments(B, S, ks) if segmented else None
    if segmented:
        assert len(np.unique(seg)) > 1
    out = jax.jit(attend, static_argnums=(3, 5))(q, k, v, window, seg, chunk)
    ref = attend_reference(q, k, v, window, seg)
    assert out.shape == (B, S, heads, Hd)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    # and the gradients (the blocked path recomputes each block's scores in the backward)
    def loss(q, k, v):
        return jnp.sum(jnp.sin(attend(q, k, v, window, seg, chunk)))

    def loss_ref(q, k, v):
        return jnp.sum(jnp.sin(attend_reference(q, k, v, window, seg)))

    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(loss_ref, argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_attend_reads_only_allowed_keys():
    # the gradient of query s's output w.r.t. the keys is non-zero exactly where s may read
    B, S, H, Hd, window = 1, 12, 2, 4, 4
    q, k, v = (jax.random.normal(jax.random.key(i), (B, S, H, Hd)) for i in range(3))
    seg = jnp.array([[0] * 7 + [1] * 5], jnp.int32)
    # row s of the Jacobian of each query's summed output: the gradient of query s alone
    jac = np.asarray(jax.jit(jax.jacrev(
        lambda k: attend(q, k, v, window, seg)[0].sum(axis=(-2, -1))))(k))   # [S, B, S, H, Hd]
    for s in range(S):
        read = {t for t in range(S) if np.abs(jac[s, 0, t]).max() > 0}
        want = {t for t in range(S) if t <= s and s - t < window and seg[0, t] == seg[0, s]}
        if len(want) > 1:  # a query reading only itself has softmax weight 1: zero gradient
            assert read == want, (s, read, want)


@pytest.fixture(scope="module")
def tiny():
    return model.init(TINY, 0)


@pytest.mark.heavy  # 10 s on 2 busy cores
def test_segments_isolate_documents(tiny):
    # dropless: with capacity drops, earlier tokens win expert slots and could change later
    # tokens' outputs through the MoE, which is not attention crossing a boundary
    params, bias = tiny
    tokens = jax.random.randint(jax.random.key(5), (2, 24), 0, TINY.vocab_size)
    fwd = jax.jit(lambda t, s: model.apply(TINY, params, bias, t, dropless=True,
                                           segment_ids=s)[0])
    assert_documents_stay_apart(fwd, tokens, TINY.vocab_size, cut=10, atol=1e-6)


@pytest.mark.heavy  # 9 s on 2 busy cores
def test_no_segments_is_one_segment(tiny):
    params, bias = tiny
    tokens = jax.random.randint(jax.random.key(6), (2, 16), 0, TINY.vocab_size)
    fwd = jax.jit(lambda s: model.apply(TINY, params, bias, tokens, segment_ids=s)[0])
    none, one = fwd(None), fwd(jnp.zeros((2, 16), jnp.int32))
    np.testing.assert_allclose(none, one, rtol=1e-6, atol=1e-6)


def test_segment_ids_shape_is_checked(tiny):
    params, bias = tiny
    tokens = jnp.zeros((2, 16), jnp.int32)
    with pytest.raises(ValueError, match="^segment_ids:"):
        model.loss_fn(TINY, params, bias, tokens, tokens, segment_ids=jnp.zeros((2, 8), jnp.int32))
