"""The dropless path (evaluation): the blocked grouped matmul against the slow reference MoE, its
compiled FLOPs against the number of experts, and 8 devices against 1."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import EXPERT_MESH_SRC, run_on_fake_devices
from helpers import dispatch_reference

from ladder.model.moe import dispatch_dropless, group_block, swiglu
from ladder.trainer.plan import hlo_flops


def weights(E: int, L: int, F: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=s) / np.sqrt(s[1]), jnp.float32)
                 for s in ((E, L, F), (E, L, F), (E, F, L)))


def reference(x, expert, w):
    """Every assignment through its expert: the reference dispatch with room for every token."""
    def experts(buf):                                                  # [E, C, L] -> [E, C, L]
        return swiglu(buf, *w, "ecl,elf->ecf", "ecf,efl->ecl")

    out, kept = dispatch_reference(experts, x, expert, w[0].shape[0], x.shape[0])
    return jnp.where(jnp.all(kept), out, jnp.nan)      # room for all: nothing may drop


ROUTINGS = {
    # top-k of random logits: every expert busy, uneven counts
    "random": lambda rng, T, k, E: np.argsort(-rng.normal(size=(T, E)), axis=1)[:, :k],
    # every token on experts 0 and 1: one expert's run spans many blocks, the others are empty
    "skewed": lambda rng, T, k, E: np.tile(np.arange(k), (T, 1)),
    # assignments dealt round-robin: every expert the same count, none a whole number of blocks
    "even": lambda rng, T, k, E: np.arange(T * k).reshape(T, k) % E,
}


@pytest.mark.parametrize("block", [None, 1, 3, 64])
def test_dropless_matches_the_reference_moe(block):
    T, k, E, L, F = 40, 2, 6, 8, 12
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(T, L)), jnp.float32)
    w = weights(E, L, F)
    fast = jax.jit(lambda x, e: dispatch_dropless(x, e, w, block=block))
    slow = jax.jit(lambda x, e: reference(x, e, w))
    for name, routing in ROUTINGS.items():
        expert = jnp.asarray(routing(rng, T, k, E), jnp.int32)
        np.testing.assert_allclose(fast(x, expert), slow(x, expert), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_block_rule():
    assert group_block(4096, 8) == 128            # capped: larger dots gain little (bench)
    assert group_block(32768, 384) == 64          # 1.6B-A61M, one sequence per device
    assert group_block(1024, 64) == 16
    assert group_block(40, 6) == 8                # at least 8


def compiled_flops(T: int, k: int, E: int, L: int) -> float:
    x = jax.ShapeDtypeStruct((T, L), jnp.float32)
    expert = jax.ShapeDtypeStruct((T, k), jnp.int32)
    w = tuple(jax.ShapeDtypeStruct((E, L, L), jnp.float32) for _ in range(3))
    text = jax.jit(dispatch_dropless).lower(x, expert, w).compile().as_text()
    return hlo_flops(text).flops


def test_compiled_flops_do_not_scale_with_the_experts():
    # jax.lax.ragged_dot compiled to E x the FLOPs (bench/dropless_dispatch.py: 8x, 32x, 128x);
    # the static block schedule computes rows + E (block - 1) rows and < 1 block per loop step
    # of padding, under 2.1 x rows with block <= rows / E; the loop's 2 steps are both counted
    T, k, L = 1024, 4, 16
    ideal = 6 * T * k * L * L                     # three matmuls of 2 L F per assignment
    few, many = compiled_flops(T, k, 8, L), compiled_flops(T, k, 64, L)
    assert ideal <= few <= 2.1 * ideal and ideal <= many <= 2.1 * ideal, \
        (few / ideal, many / ideal)


SHARDED = EXPERT_MESH_SRC + textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from functools import partial
    from ladder.specs import LADDERS
    from ladder import model
    assert jax.device_count() == 8
    cfg = LADDERS["tiny"].rungs[0].model.replace(n_experts=8)
    params, bias = model.init(cfg, 0)
    # a skewed router bias: dropless must keep what capacity would drop
    bias = bias.at[:, 0].set(3.0)
    tokens = jax.random.randint(jax.random.key(1), (8, 32), 0, cfg.vocab_size)   # 1 per device
    fwd = jax.jit(partial(model.loss_fn, cfg, dropless=True))
    loss1, s1 = fwd(params, bias, tokens, tokens)

    mesh, sharded, toks = on_expert_mesh(params, tokens)
    with jax.set_mesh(mesh):
        loss8, s8 = fwd(sharded, bias, toks, toks)
    assert float(s8["moe/drop_frac"]) == float(s1["moe/drop_frac"]) == 0.0
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    print("ok")
""")


@pytest.mark.slow
def test_dropless_on_a_data_expert_mesh_matches_one_device():
    assert run_on_fake_devices(SHARDED).strip().endswith("ok")
