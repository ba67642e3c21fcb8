"""The quantile-balancing rule (model/balance.py): margins by hand, the histogram quantile against
numpy's, counts that sum over devices, the rule wired into the model, and the load CV it reaches
on a fixed synthetic router against today's threshold rule."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from bench.balance import load_cvs, synthetic_router  # noqa: E402
from ladder.model.balance import (  # noqa: E402
    N_BINS,
    bias_from_histogram,
    margin_histogram,
    margins,
    upper_quantile,
)
from helpers import quantile_bias  # noqa: E402


def test_margins_by_hand():
    s = jnp.array([[3.0, 1.0, 2.0, 0.0]])
    b = jnp.array([0.0, 0.0, -1.5, 0.5])
    # biased: [3, 1, 0.5, 0.5]; K=1 -> alpha = 2nd largest biased = 1.0
    np.testing.assert_allclose(margins(s, b, 1)[0], [2.0, 0.0, 1.0, -1.0])
    # K=2 -> alpha = 3rd largest = 0.5
    np.testing.assert_allclose(margins(s, b, 2)[0], [2.5, 0.5, 1.5, -0.5])


@pytest.mark.heavy  # 8 s on 2 busy cores
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_histogram_quantile_matches_numpy_within_a_bin(scale):
    rng = np.random.default_rng(0)
    m = (rng.standard_normal((4000, 3)) * scale).astype(np.float32)
    # raw logits m, biased far down, beside two huge columns and a zero one: with K=2 every
    # token's threshold alpha (3rd-largest biased logit) is that zero, so the margins are m
    logits = jnp.asarray(np.concatenate([m, np.full((4000, 2), 1e6, np.float32),
                                         np.zeros((4000, 1), np.float32)], axis=1))
    bias = jnp.array([-1e6, -1e6, -1e6, 0.0, 0.0, 0.0])
    counts = margin_histogram(logits, bias, 2)
    got = np.asarray(upper_quantile(counts[:3], 0.25))
    want = np.quantile(m, 0.75, axis=0)
    np.testing.assert_allclose(got, want, rtol=5e-3, atol=3e-6)        # ~2 bins of 0.25%


@pytest.mark.heavy  # 7 s on 2 busy cores
def test_counts_sum_over_devices_and_microbatches():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.standard_normal((512, 16)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(16) * 0.1, jnp.float32)
    hist = jax.jit(margin_histogram, static_argnums=2)
    whole = hist(logits, bias, 4)
    halves = hist(logits[:256], bias, 4) + hist(logits[256:], bias, 4)
    assert whole.shape == (16, N_BINS) and float(whole.sum()) == 512 * 16
    np.testing.assert_array_equal(np.asarray(whole), np.asarray(halves))
    new = bias_from_histogram(whole, 4)
    np.testing.assert_allclose(bias_from_histogram(whole / 2, 4), new, rtol=1e-6, atol=1e-7)
    assert abs(float(jnp.mean(new))) < 1e-6                             # centred
    np.testing.assert_allclose(quantile_bias(logits, bias, 4), new)


@pytest.mark.heavy  # 14 s on 2 busy cores
def test_quantile_rule_in_the_model():
    import ladder.model as M
    from ladder.specs import LADDERS

    cfg = LADDERS["tiny"].rungs[0].model.replace(bias_rule="quantile")
    params, rb = M.init(cfg, 0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 32)), jnp.int32)
    _, stats = jax.jit(lambda p, b, t: M.loss_fn(cfg, p, b, t, t))(params, rb, tokens)
    # the mergeable statistic is the margin histogram (summed over microbatches and devices);
    # the target is the bias it gives, and the rule replaces the bias with it
    assert stats["moe/bias_stat"].shape == (cfg.n_layers, cfg.n_experts, N_BINS)
    np.testing.assert_allclose(np.asarray(stats["moe/bias_target"]), np.asarray(
        bias_from_histogram(stats["moe/bias_stat"], cfg.top_k)), rtol=1e-5, atol=1e-7)  # jit
    new = M.update_router_bias(cfg, rb, stats)
    assert new.shape == rb.shape
    np.testing.assert_allclose(np.asarray(new), np.asarray(stats["moe/bias_target"]))
    with pytest.raises(ValueError, match="bias_rule"):
        cfg.replace(bias_rule="median")


@pytest.mark.heavy  # 7 s on 2 busy cores
def test_quantile_rule_balances_a_small_router_better_than_the_threshold_rule():
    # the synthetic router of bench/balance.py at 1/8 of the size (seconds, not a minute)
    base = synthetic_router(n_experts=32, n_tokens=4096, clusters=8, per_cluster=8)
    threshold = load_cvs("threshold", base, 4, 3)
    quantile = load_cvs("quantile", base, 4, 15)
    assert np.mean(quantile[-5:]) < 0.5 * np.mean(threshold[-2:]), (quantile, threshold)


@pytest.mark.slow  # ~45 s on 2 shared cores: 30 steps of T=16,384 x E=128
def test_load_cv_at_the_recipes_level_on_the_issue_sized_router():
    base = synthetic_router()                                          # E=128, T=16,384
    threshold = load_cvs("threshold", base, 8, 3)
    quantile = load_cvs("quantile", base, 8, 30)
    # Today's rule does not depend on the bias: it sits at its level from step 2 on, inside the
    # 0.10-0.27 that issue 12 quotes. The recipe's settles within ~20 steps; its level in the
    # recipe authors' simulation is 0.04, which it must reach (measured here: ~0.025, below the
    # 0.030 binomial floor of independent routing because the per-token logits are fixed).
    assert 0.10 <= np.mean(threshold[1:]) <= 0.27, threshold
    assert np.mean(quantile[-10:]) < 0.04, quantile
    assert max(quantile[-10:]) < 0.045, quantile
