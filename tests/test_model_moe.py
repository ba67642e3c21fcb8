"""The MoE layer: fast vs reference dispatch, exact drop counting, routing weights, bias rules."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import dispatch_reference, threshold_bias

from ladder.model.config import BIAS_RULES, BiasRule, ModelConfig
from ladder.model.layers import materialize
from ladder.model.moe import (
    RULES,
    MoE,
    capacity,
    dispatch_sorted,
    drop_keys,
    moe_stats,
    route,
    update_router_bias,
)


def small_cfg(**kw) -> ModelConfig:
    base = {"vocab_size": 32, "d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 8,
            "n_kv_heads_local": 1, "n_kv_heads_global": 1, "n_experts": 4, "top_k": 2,
            "n_shared": 1, "expert_dim": 8, "latent_dim": 8, "shared_dim": 8}
    return ModelConfig(**{**base, **kw})


def init_layer(layer, *args, seed=0):
    return materialize(jax.eval_shape(layer.init, jax.random.key(0), *args)["params"], seed)


def run_moe(cfg, x, bias, dispatch, dropless=False, params=None):
    layer = MoE(cfg, dispatch=dispatch)
    if params is None:
        params = init_layer(layer, x, bias)
    y, aux = jax.jit(lambda p, x, b: layer.apply({"params": p}, x, b, dropless))(params, x, bias)
    return params, y, aux


@pytest.mark.heavy  # 17 s on 2 busy cores
@pytest.mark.parametrize("capacity_factor,dropless,cell", [(0.5, False, None), (0.5, True, None),
                                                          (0.5, False, 12)])
def test_sorted_dispatch_matches_reference(capacity_factor, dropless, cell):
    cfg = small_cfg(capacity_factor=capacity_factor, capacity_tokens=cell)
    x = jax.random.normal(jax.random.key(1), (2, 24, cfg.d_model))
    # a skewed bias so that some experts overflow at low capacity
    bias = jnp.array([1.0, 0.5, 0.0, -0.5])
    params, y_fast, aux_fast = run_moe(cfg, x, bias, dispatch_sorted, dropless)
    _, y_ref, aux_ref = run_moe(cfg, x, bias, dispatch_reference, dropless, params)
    np.testing.assert_allclose(y_fast, y_ref, rtol=1e-5, atol=1e-6)
    for key in aux_ref:
        np.testing.assert_allclose(aux_fast[key], aux_ref[key], rtol=1e-6, atol=1e-7)
    if capacity_factor < 1 and not dropless:
        assert aux_fast["drop_frac"] > 0.1  # the comparison covered dropping
    if dropless:
        assert aux_fast["drop_frac"] == 0


def test_capacity_formula():
    cfg = small_cfg(n_experts=8, top_k=2, capacity_factor=1.25)
    assert capacity(cfg, 100) == math.ceil(1.25 * 100 * 2 / 8) == 32
    assert capacity(cfg, 100, dropless=True) == 100
    assert capacity(small_cfg(n_experts=4, top_k=2, capacity_factor=10.0), 6) == 6  # at most T


# A hand-built routing: T=4 tokens, k=2, E=3, capacity 2. Expert 0 is chosen by tokens 0,1,2,3
# (keeps 0,1), expert 1 by tokens 0,2,3 (keeps 0,2), expert 2 by token 1: 3 of 8 dropped.
HAND_EXPERT = np.array([[0, 1], [0, 2], [0, 1], [1, 0]], np.int32)
HAND_KEPT = np.array([[True, True], [True, True], [False, True], [False, False]])


@pytest.mark.heavy  # 11 s on 2 busy cores
@pytest.mark.parametrize("dispatch", [dispatch_sorted, dispatch_reference])
def test_drops_exact_on_hand_built_routing(dispatch):
    x = jnp.arange(4 * 3, dtype=jnp.float32).reshape(4, 3) + 1.0       # [T, L], no zero rows
    scale = jnp.array([1.0, 10.0, 100.0])                  # expert e multiplies by scale[e]

    def expert_fn(buf):                                                # [E, C, L] -> [E, C, L]
        return buf * scale[:, None, None]

    out, kept = jax.jit(lambda x, e: dispatch(expert_fn, x, e, 3, 2))(x, jnp.asarray(HAND_EXPERT))
    np.testing.assert_array_equal(kept, HAND_KEPT)
    expert_scale = np.asarray(scale)[HAND_EXPERT][..., None]          # [T, k, 1]
    want = np.where(HAND_KEPT[..., None], np.asarray(x)[:, None, :] * expert_scale, 0.0)
    np.testing.assert_allclose(out, want)

    cfg = small_cfg(n_experts=3, top_k=2)
    routing_logits = jnp.zeros((4, 3))
    stats = moe_stats(cfg, routing_logits, route(cfg, routing_logits, jnp.zeros(3))._replace(
        expert=jnp.asarray(HAND_EXPERT)), kept)
    assert float(stats["drop_frac"]) == pytest.approx(3 / 8, abs=0)
    np.testing.assert_array_equal(stats["load"], [4, 3, 1])
    # the recipe's router statistics (Marin's grug MoE `_routing_stats`): the entropy of the
    # assignment shares f = (4, 3, 1) / 8 and E sum_e (k f_e) P_e, here with uniform P = 1/3
    f = np.array([4, 3, 1]) / 8
    assert float(stats["router_entropy"]) == pytest.approx(
        -(0.5 * math.log(0.5) + 0.375 * math.log(0.375) + 0.125 * math.log(0.125)), abs=2e-5)
    assert float(stats["balance_loss"]) == pytest.approx(3 * np.sum(2 * f / 3), rel=1e-6)
    assert float(stats["balance_loss"]) == pytest.approx(2.0, rel=1e-6)   # k at uniform P


@pytest.mark.heavy  # 7 s on 2 busy cores
def test_balance_loss_is_k_times_switch_and_entropy_falls_with_concentration():
    cfg = small_cfg(n_experts=4, top_k=2)
    logits = jnp.asarray(np.random.default_rng(0).standard_normal((16, 4)), jnp.float32)
    expert = jnp.asarray(np.array([[0, 1]] * 10 + [[2, 3]] * 6), jnp.int32)
    r = route(cfg, logits, jnp.zeros(4))._replace(expert=expert)
    s = moe_stats(cfg, logits, r, jnp.ones((16, 2), bool))
    p = np.exp(np.asarray(logits, np.float64))
    p = (p / p.sum(-1, keepdims=True)).mean(0)
    np.testing.assert_allclose(s["prob"], p, rtol=1e-6)
    tokens_share = np.array([10, 10, 6, 6]) / 16             # share of tokens sent to e
    switch = 4 * np.sum(tokens_share / 2 * p)                 # Fedus et al.: f = assignments / A
    assert float(s["balance_loss"]) == pytest.approx(4 * np.sum(tokens_share * p), rel=1e-6)
    assert float(s["balance_loss"]) == pytest.approx(2 * switch, rel=1e-6)
    even = moe_stats(cfg, logits, r._replace(expert=jnp.asarray([[0, 1], [2, 3]] * 8)),
                     jnp.ones((16, 2), bool))
    assert float(even["router_entropy"]) == pytest.approx(math.log(4), abs=1e-5)
    assert float(s["router_entropy"]) < float(even["router_entropy"])


@pytest.mark.heavy  # 10 s on 2 busy cores
def test_dropless_drops_nothing_where_capacity_drops_half():
    # the bias forces every token onto experts 0 and 1: with T=8, k=2, E=4 and capacity factor 1
    # each expert has ceil(8*2/4) = 4 slots, so experts 0 and 1 keep 4 of 8 each: half dropped
    cfg = small_cfg(capacity_factor=1.0)
    x = jax.random.normal(jax.random.key(2), (1, 8, cfg.d_model))
    bias = jnp.array([100.0, 50.0, 0.0, 0.0])
    params, y_drop, aux_drop = run_moe(cfg, x, bias, dispatch_sorted)
    _, y_all, aux_all = run_moe(cfg, x, bias, dispatch_sorted, dropless=True, params=params)
    assert float(aux_drop["drop_frac"]) == 0.5
    assert float(aux_all["drop_frac"]) == 0.0
    np.testing.assert_array_equal(aux_all["load"], [8, 8, 0, 0])
    # each expert keeps the 4 of its 8 assignments that come first in the step's drop order
    # (issue 22: a random order, not the first 4): tokens that kept both experts agree with
    # dropless, tokens that lost both do not (routing: every token's top-2 is experts 0 and 1)
    key = np.asarray(drop_keys(0, 8, 2, 8, 8))              # [T, k]; seed 0 outside a train step
    expert = np.asarray(route(cfg, jnp.asarray(np.asarray(x[0]) @ np.asarray(params["router"])),
                              bias).expert)
    assert sorted(set(expert.ravel())) == [0, 1]
    won = []
    for e in (0, 1):
        key_e = [key[t][list(expert[t]).index(e)] for t in range(8)]   # token t's key for e
        won.append(set(np.argsort(key_e, kind="stable")[:4]))
    both, neither = sorted(won[0] & won[1]), sorted(set(range(8)) - won[0] - won[1])
    assert both and neither
    np.testing.assert_allclose(y_drop[0, both], y_all[0, both], rtol=1e-5, atol=1e-6)
    for t in neither:
        assert not np.allclose(y_drop[0, t], y_all[0, t])


@pytest.mark.heavy  # 10 s on 2 busy cores
@pytest.mark.parametrize("dispatch", [dispatch_sorted, dispatch_reference],
                         ids=["sorted", "reference"])
def test_drop_priority_is_the_key(dispatch):
    """Five tokens want expert 0, which has 2 slots: the two with the lowest drop key keep it,
    wherever they sit (issue 22 item 2: by position the last ones always lost); equal keys go
    to the earlier token; without keys, position decides (the old rule, kept for the bench)."""
    x = jnp.arange(5 * 2, dtype=jnp.float32).reshape(5, 2) + 1.0

    def kept(key):
        _, k = dispatch(lambda buf: buf, x, jnp.zeros((5, 1), jnp.int32), 2, 2,
                        None if key is None else jnp.asarray(key, jnp.uint32)[:, None])
        return np.asarray(k)[:, 0].tolist()

    assert kept([9, 1, 5, 7, 3]) == [False, True, False, False, True]
    assert kept([8, 2, 2, 2, 9]) == [False, True, True, False, False]
    assert kept([2**32 - 1, 2**31, 7, 2**32 - 2, 1]) == [False, False, True, False, True]
    assert kept(None) == [True, True, False, False, False]


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_drop_order_is_random_per_sequence_and_causal():
    """The keys of a step: increasing with the position within a sequence (so a later token of
    a sequence never takes an earlier one's slot: causal), no ties in a cell, the same in every
    cell (a layout that holds whole cells sees the same order), another order of the cell's
    sequences at another step, and over many steps every sequence place of a cell is first
    equally often (by position, the last sequences of a batch always lost)."""
    T, k, cell, seq = 64, 2, 16, 4
    a, b = np.asarray(drop_keys(3, T, k, cell, seq)), np.asarray(drop_keys(4, T, k, cell, seq))
    assert a.dtype == np.uint32 and a.shape == (T, k)
    flat = a[:cell].ravel()                                            # place t*k + j
    assert len(set(flat)) == cell * k                                  # no ties in a cell
    for s in range(cell // seq):                                       # causal within a sequence
        assert np.all(np.diff(flat[s * seq * k:(s + 1) * seq * k].astype(np.int64)) > 0)
    np.testing.assert_array_equal(a[:cell], a[cell:2 * cell])          # every cell alike
    order = [np.argsort([x[s * seq, 0] for s in range(4)]) for x in (a, b)]
    assert not np.array_equal(order[0], order[1])                      # steps 3, 4: new order
    # 2 of a cell's 4 sequences keep a half-capacity expert: over 400 steps each sequence place
    # is among them ~200 times (binomial sd 10); a positional rule would give 0 or 400
    wins = np.zeros(4)
    for step in range(400):
        keys = np.asarray(drop_keys(step, cell, 1, cell, seq))[:, 0]
        np.add.at(wins, np.argsort(keys)[:cell // 2] // seq, 1)           # tokens kept
    assert np.all(wins % seq == 0)                                     # whole sequences win
    wins /= seq
    assert wins.min() > 150 and wins.max() < 250, wins


@pytest.mark.heavy  # 11 s on 2 busy cores
def test_each_cell_has_its_own_capacity():
    """Dispatch over 4 cells of 8 tokens = each cell dispatched alone (sorted and reference),
    on a random routing with drop keys and drops."""
    rng = np.random.default_rng(4)
    T, k, E, cap = 32, 2, 4, 3
    x = jnp.asarray(rng.standard_normal((T, 5)), jnp.float32)
    expert = jnp.asarray(np.stack([rng.choice(E, 2, replace=False) for _ in range(T)]),
                         jnp.int32)
    key = jnp.asarray(rng.integers(0, 2**32, (T, k), dtype=np.uint64).astype(np.uint32))

    def expert_fn(buf):                                                # [E, C, L]
        return buf * jnp.arange(1, E + 1, dtype=jnp.float32)[:, None, None]

    for dispatch in (dispatch_sorted, dispatch_reference):
        out, kept = dispatch(expert_fn, x, expert, E, cap, key, 4)
        parts = [dispatch(expert_fn, x[c * 8:(c + 1) * 8], expert[c * 8:(c + 1) * 8], E, cap,
                          key[c * 8:(c + 1) * 8]) for c in range(4)]
        np.testing.assert_array_equal(kept, np.concatenate([p[1] for p in parts]))
        np.testing.assert_allclose(out, np.concatenate([p[0] for p in parts]), rtol=1e-6)
        assert 0 < np.mean(~np.asarray(kept)) < 0.5                   # some dropped, not most
    # one cell of all 32 tokens (the old per-call cell) drops another set
    assert not np.array_equal(dispatch_sorted(expert_fn, x, expert, E, 4 * cap, key)[1], kept)


@pytest.mark.heavy  # 8 s on 2 busy cores
def test_moe_layer_is_the_same_function_split_at_cell_boundaries():
    """The MoE layer on 4 sequences with cells of 2 sequences = the layer on each pair alone
    (what 2 devices or 2 microbatches see), with drops; cells that do not divide a call fail."""
    cfg = small_cfg(capacity_factor=0.75, capacity_tokens=24)
    x = jax.random.normal(jax.random.key(5), (4, 12, cfg.d_model))
    bias = jnp.array([0.6, 0.2, 0.0, -0.4])
    params, y, aux = run_moe(cfg, x, bias, dispatch_sorted)
    halves = [run_moe(cfg, x[i:i + 2], bias, dispatch_sorted, params=params) for i in (0, 2)]
    np.testing.assert_allclose(y, np.concatenate([h[1] for h in halves]), rtol=1e-6, atol=1e-7)
    drops = [float(h[2]["drop_frac"]) for h in halves]
    assert float(aux["drop_frac"]) == pytest.approx(np.mean(drops)) and max(drops) > 0
    with pytest.raises(ValueError, match="^capacity_tokens:"):                # 36 tokens
        run_moe(cfg, jnp.concatenate([x, x[:2]])[:3], bias, dispatch_sorted, params=params)
    # a call shorter than a cell is one cell: the per-call rule
    short = run_moe(cfg, x[:1], bias, dispatch_sorted, params=params)[1]   # 12 tokens
    whole = run_moe(cfg.replace(capacity_tokens=None), x[:1], bias, dispatch_sorted,
                    params=params)[1]
    np.testing.assert_array_equal(short, whole)


def test_combine_weights_use_unbiased_logits():
    cfg = small_cfg(n_experts=3, top_k=2, route_scale=2.5)
    logits = jnp.array([[1.0, 2.0, 3.0]])
    r = route(cfg, logits, jnp.array([10.0, 0.0, 0.0]))        # the bias makes expert 0 win
    assert sorted(np.asarray(r.expert[0]).tolist()) == [0, 2]
    s = 1 / (1 + np.exp(-np.array([1.0, 3.0])))
    want = dict(zip([0, 2], 2.5 * s / s.sum(), strict=True))
    got = dict(zip(np.asarray(r.expert[0]).tolist(), np.asarray(r.weight[0]).tolist(),
                   strict=True))
    assert got == pytest.approx(want, rel=1e-6)
    r = route(small_cfg(n_experts=3, top_k=2, combine="softmax", route_scale=1.0), logits,
              jnp.zeros(3))
    np.testing.assert_allclose(r.weight[0], [np.exp(1) / (1 + np.exp(1)), 1 / (1 + np.exp(1))],
                               rtol=1e-6)  # experts 2 then 1


def test_threshold_bias_hand_computed():
    # k=1, E=2, T=4: n = T*k/E = 2. Expert 0's 2nd-largest logit is 3, expert 1's is 2:
    # bias = (-3, -2), centred -> (-0.5, 0.5)
    logits = jnp.array([[4.0, 0.0], [3.0, 1.0], [2.0, 5.0], [1.0, 2.0]])
    np.testing.assert_allclose(threshold_bias(logits, 1), [-0.5, 0.5])


def test_bias_rules_move_only_by_their_rule():
    bias = jnp.array([[0.1, -0.2, 0.3, 0.0]])
    load = jnp.array([[10.0, 30.0, 20.0, 20.0]])                  # mean 20
    target = jnp.array([[1.0, 2.0, -3.0, 0.0]])
    stats = {"moe/load": load, "moe/bias_target": target}
    u = 0.01
    def update(**kw):
        return update_router_bias(small_cfg(**kw), bias, stats)

    np.testing.assert_allclose(update(bias_rule="sign", bias_rate=u),
                               [[0.1 + u, -0.2 - u, 0.3, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(update(bias_rule="threshold"), target)
    np.testing.assert_array_equal(update(bias_rule="none"), bias)


def test_every_bias_rule_name_has_one_behaviour():
    """A rule is a BiasRule member with its class in moe.RULES: a name without behaviour (or a
    behaviour no name reaches) is caught here, not at the first step of a run."""
    assert set(RULES) == set(BiasRule) and BIAS_RULES == tuple(RULES)
    for name in BIAS_RULES:
        cfg = small_cfg(bias_rule=name)
        # parsed at the edge; config.json keeps the name, and reads back to the same config
        assert cfg.bias_rule is BiasRule(name) and cfg.to_dict()["bias_rule"] == name
        assert ModelConfig.from_dict(json.loads(cfg.to_json())) == cfg
        assert json.loads(cfg.to_json())["bias_rule"] == name
    for bad in ("median", "", 3, None):
        with pytest.raises(ValueError, match=r"^bias_rule: must be one of"):
            small_cfg(bias_rule=bad)


@pytest.mark.parametrize("rule", ["threshold", "quantile"])
def test_the_plan_counts_the_statistic_the_rule_makes(rule):
    """ladder/trainer/plan.py sizes the balancing statistic by stat_width: the rule's own."""
    from ladder.model.moe import balancing_rule, bias_stat
    cfg = small_cfg(bias_rule=rule)
    logits = jax.random.normal(jax.random.key(0), (24, cfg.n_experts))
    stat = bias_stat(cfg, logits, bias=jnp.zeros(cfg.n_experts))
    assert stat.shape == (cfg.n_experts, balancing_rule(cfg).stat_width(cfg, 24))


def _balance(rule: str, steps: int = 300, tokens: int = 2048):
    """Route skewed logits (expert e gets a +1.5 .. -1.5 offset) for ``steps`` steps, updating the
    bias by ``rule`` after each; return the mean load over the last 50 steps and the first
    step's load."""
    E = 8
    cfg = small_cfg(n_experts=E, top_k=2, bias_rule=rule, bias_rate=0.01)
    skew = jnp.linspace(1.5, -1.5, E)

    def step(bias, key):
        logits = jax.random.normal(key, (tokens, E)) + skew          # [T, E]
        r = route(cfg, logits, bias[0])
        s = moe_stats(cfg, logits, r, jnp.ones_like(r.expert, bool))
        stats = {"moe/load": s["load"][None], "moe/bias_target": s["bias_target"][None]}
        return update_router_bias(cfg, bias, stats), s["load"]

    keys = jax.random.split(jax.random.key(3), steps)
    _, loads = jax.jit(lambda b: jax.lax.scan(step, b, keys))(jnp.zeros((1, E)))
    return np.asarray(loads[-50:].mean(0)), np.asarray(loads[0])


@pytest.mark.parametrize("rule", ["threshold", "sign"])
def test_bias_rule_balances_skewed_load(rule):
    final, first = _balance(rule)
    uniform = final.mean()
    assert first.max() / first.mean() > 2          # the skew really unbalanced the start
    assert np.all(np.abs(final / uniform - 1) < 0.10), final / uniform
