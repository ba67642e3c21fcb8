"""Gradient accumulation: a step in microbatches equals the step on one big batch."""

import jax
import numpy as np
import pytest

from ladder.data import stdlib_corpus
from ladder.specs import LADDERS
from ladder.step import make_mesh, programs
from model.config import ModelConfig
from model.moe import bias_target_from_stat, merge_bias_stat, step_tokens, threshold_bias, \
    top_logits


def test_threshold_statistic_merges_exactly():
    logits = jax.random.normal(jax.random.key(0), (64, 4))
    k, E = 2, 4
    n = 64 * k // E                                   # 32: more than either half's 16 tokens
    cfg = ModelConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=1, head_dim=8,
                      n_kv_heads_local=1, n_kv_heads_global=1, n_experts=E, top_k=k)
    parts = [top_logits(logits[i::4], n) for i in range(4)]       # 4 microbatches of 16
    assert np.isinf(np.asarray(parts[0])[:, 16:]).all()          # padded: fewer tokens than n
    merged = parts[0]
    for p in parts[1:]:
        merged = merge_bias_stat(cfg, merged, p)
    np.testing.assert_array_equal(merged, top_logits(logits, n))
    np.testing.assert_allclose(bias_target_from_stat(cfg, merged), threshold_bias(logits, k),
                               rtol=0, atol=1e-7)
    # one microbatch alone would give another target: the merge is what makes it the step's
    assert not np.allclose(threshold_bias(logits[::4], k), threshold_bias(logits, k), atol=1e-3)
    with step_tokens(64):                      # the statistic sized for the step, not the call
        from model.moe import threshold_n
        assert threshold_n(cfg, 16) == 32
    assert threshold_n(cfg, 16) == 8


@pytest.mark.slow   # two compiles of the step per rule: ~20 s on 2 busy cores
@pytest.mark.parametrize("bias_rule", ["threshold", "sign"])
def test_microbatched_step_matches_one_big_batch(bias_rule):
    rung = LADDERS["tiny"].rungs[0]
    # capacity_factor = E / k gives every expert T slots in every call: nothing is dropped, so
    # per-microbatch capacity cannot change the numbers and the comparison is exact math
    cfg = rung.model.replace(capacity_factor=rung.model.n_experts / rung.model.top_k,
                             bias_rule=bias_rule, bias_rate=0.01)
    batch, seq = 8, rung.seq_len
    corpus = stdlib_corpus()
    mesh = make_mesh(1, 1, cfg.n_experts, batch)
    runs, stats = {}, {}
    for micro in (1, 4):
        progs = programs(cfg, mesh, microbatches=micro)
        state = progs.init_state(0)
        losses, biases, drops = [], [], []
        for i in range(3):
            b = {**corpus.batch(0, i, batch, seq), "lr": np.float32(3e-3)}
            state, m = progs.train_step(state, jax.device_put(b))
            losses.append(float(m["train/loss"]))
            drops.append(float(m["moe/drop_frac"]))
            biases.append(np.asarray(state["router_bias"]))
        runs[micro] = losses, biases, drops, float(m["moe/load_max_over_mean"])
        stats[micro] = [float(m[k]) for k in ("moe/router_entropy", "moe/balance_loss")]
    (l1, b1, d1, lm1), (l4, b4, d4, lm4) = runs[1], runs[4]
    # the recipe's router statistics are the whole step's (from the summed load and the mean
    # router probabilities), not a mean of the microbatches' (issue 22 item 3)
    np.testing.assert_allclose(stats[4], stats[1], rtol=1e-6)
    np.testing.assert_allclose(l4, l1, rtol=2e-6)
    for a, b in zip(b1, b4):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert np.abs(b1[-1]).max() > 1e-3          # the bias really moved
    assert d1 == d4 == [0.0, 0.0, 0.0]
    assert lm4 == pytest.approx(lm1, rel=1e-6)   # from the step's summed load, not one part's
