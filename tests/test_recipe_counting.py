"""The recipe's pieces in the one counter, the optimizer groups and the capacity (issue 12, items
4 and 5): counted = the real pytree with every switch on, outside active parameters (the real
ladder's names do not move), their FLOPs in the forward; GatedNorm matrices under MuonH, the
gates and convolution kernels under Adam; capacity 1.15 per (sender shard, expert) cell."""

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_on_fake_devices
from flax.traverse_util import flatten_dict

from ladder import model
from ladder.counting import count_params, flops_per_token
from ladder.model.config import ModelConfig
from ladder.specs import LADDERS

RECIPE = dict(init="recipe", rope_fraction=0.5, global_rope=False, qk_norm="rms", qk_mult=1.3,
              embed_norm=True, gated_norm_rank=128, conv_kernel=4, xsa=True, head_gate=True)
ITEM4_OFF = dict(gated_norm_rank=0, conv_kernel=0, xsa=False, head_gate=False)
# 10 layers: 2 scanned [L, L, L, G] groups + layers 8 (L) and 9 (G) unrolled; d 48 < rank 128
SCANNED = ModelConfig(vocab_size=64, d_model=48, n_layers=10, n_heads=6, head_dim=8,
                      n_kv_heads_local=3, n_kv_heads_global=1, n_experts=4, top_k=2,
                      expert_dim=8, latent_dim=8, shared_dim=8)


@pytest.mark.parametrize("cfg", [SCANNED.replace(**RECIPE), SCANNED.replace(**{**RECIPE,
                                 "gated_norm_rank": 5}), LADDERS["cpu"].rungs[0].model.replace(
                                 **RECIPE)], ids=["scanned-full-rank", "scanned-rank5", "cpu"])
def test_counted_equals_the_pytree_with_every_switch(cfg):
    params, bias = model.param_shapes(cfg)
    counted = count_params(cfg)
    sizes = {g: sum(math.prod(x.shape) for x in leaves)
             for g, leaves in model.param_groups(params).items()}
    assert sum(sizes.values()) + math.prod(bias.shape) == counted.total
    L, E = cfg.n_layers, cfg.n_experts
    assert sizes == {
        "embedding": counted.embedding, "lm_head": counted.lm_head,
        "attention": counted.attention, "norms": counted.norms,
        "router": counted.router - L * E, "latent": counted.latent,
        "shared_experts": counted.shared_experts, "routed_experts": counted.routed_experts,
        "gated_norms": counted.gated_norms, "convs": counted.convs,
        "head_gates": counted.head_gates,
    }
    assert counted.gated_norms > 0 and counted.convs > 0 and counted.head_gates > 0


def test_extras_are_outside_active_and_in_the_flops():
    for cfg in (SCANNED.replace(**RECIPE), LADDERS["marin-535b"].rungs[0].model):
        off = cfg.replace(**ITEM4_OFF)
        for conv in ("exact-v1", "marin-sizing-v1"):
            on_c, off_c = count_params(cfg, conv), count_params(off, conv)
            assert on_c.active == off_c.active
            assert on_c.total - off_c.total == on_c.extras > 0
        f_on, f_off = flops_per_token(cfg, 64), flops_per_token(off, 64)
        assert (f_on.matmul, f_on.attention, f_on.lm_head) == (f_off.matmul, f_off.attention,
                                                               f_off.lm_head)
        assert f_off.extras == 0
        # GatedNorm, the head gate and the convolutions are one multiply-add per weight and
        # token (2 FLOPs); XSA two dot products and a scaled subtraction per head
        p = count_params(cfg)
        assert f_on.extras == 2 * p.extras + 6 * cfg.q_dim * cfg.n_layers
        assert f_on.forward_no_lm_head - f_off.forward_no_lm_head == f_on.extras


def test_real_ladder_names_do_not_move():
    # the published names (Marin's public hero-run tracking issue)
    names = ["1.6B-A61M", "4.0B-A162M", "11.5B-A481M", "27.7B-A1.2B", "535B-A23B"]
    assert [r.name for r in LADDERS["marin-535b"].all] == names
    from ladder.specs import format_name
    for rung in LADDERS["marin-535b"].all:
        assert rung.params.extras > 0
        # the sizes behind the names: the total still rounds to the published one, the active
        # count is the one without the pieces (which sets the token budget: the steps)
        total, active = rung.name.split("-A")
        assert format_name(rung.params).split("-A")[0] == total
        off = rung.model.replace(**ITEM4_OFF)
        assert count_params(off, "marin-sizing-v1").active == rung.params.active
        # 0.7% (hero) to 3.8% (1.6B) of the forward: the published FLOP figures leave them out
        assert 0.005 < rung.flops.extras_fraction < 0.04


def test_optimizer_groups_of_the_pieces():
    from ladder.trainer.optim import marin_groups

    cfg = SCANNED.replace(**RECIPE)
    params, _ = model.param_shapes(cfg)
    groups = flatten_dict(marin_groups(params), is_leaf=lambda p, x: hasattr(x, "kind"))
    seen = set()
    for path, g in groups.items():
        leaf = path[-1]
        if leaf in ("gate_down", "gate_up"):
            assert g.kind == "muonh", path
            assert (tuple(g.dims.reduction_axis), tuple(g.dims.output_axis)) == ((-2,), (-1,))
        elif leaf in ("k_conv", "out_conv", "moe_conv", "attn_gate", "scale"):
            assert g.kind == "adam", path
        seen.add(leaf)
    assert {"gate_down", "gate_up", "k_conv", "out_conv", "moe_conv", "attn_gate"} <= seen
    assert ("embed_norm", "gate_down") in groups and ("groups", "block_0", "attn",
                                                      "attn_gate") in groups
    assert set(model.param_groups(params)) == set(model.PARAM_GROUPS)


def test_recipe_rungs_carry_capacity_115():
    for rung in LADDERS["marin-535b"].all:
        assert rung.model.capacity_factor == 1.15, rung.name
        assert rung.to_dict()["model"]["capacity_factor"] == 1.15
    assert all(r.model.capacity_factor == 1.15 for r in LADDERS["cpu"].all)  # the recipe's
    # tiny's one-sequence cells: the recipe's headroom scaled to their spread (tiny.toml)
    assert all(r.model.capacity_factor == 1.6 for r in LADDERS["tiny"].all)


def test_list_json_shows_the_switches():
    import json

    out = subprocess.run([sys.executable, "-m", "ladder", "list", "marin-535b", "--json"],
                         check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    assert all(r["compute_extras"] > 0 for r in rows)
    assert all(r["compute_no_lm_head"] > r["compute_extras"] for r in rows)


# ------------------------------------------------------------- 8 devices: cells and shardings
SCRIPT = textwrap.dedent("""
    import math
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from flax.traverse_util import flatten_dict
    from ladder import model
    from ladder.model.config import ModelConfig
    from ladder.model.layers import materialize
    from ladder.model.moe import MoE, route
    from ladder.trainer.step import make_optimizer, state_shardings
    from ladder.specs import LADDERS

    assert jax.device_count() == 8
    RECIPE = dict(init="recipe", rope_fraction=0.5, global_rope=False, qk_norm="rms",
                  qk_mult=1.3, embed_norm=True, gated_norm_rank=128, conv_kernel=4, xsa=True,
                  head_gate=True)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=5, n_heads=2, head_dim=16,
                      n_kv_heads_local=2, n_kv_heads_global=1, n_experts=8, top_k=2,
                      expert_dim=8, latent_dim=8, shared_dim=8, capacity_factor=1.15,
                      precision="f32", **RECIPE)
    mesh = jax.make_mesh((2, 4), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)

    # 1. the drop fraction is counted per (sender shard, expert) cell, as the real run's was
    layer = MoE(cfg)
    B, S = 8, 16                                 # one row of 16 tokens per device
    x = jax.random.normal(jax.random.key(0), (B, S, cfg.d_model))
    bias = jnp.linspace(1.0, -1.0, cfg.n_experts)  # skewed: some cells overflow
    p = materialize(jax.eval_shape(layer.init, jax.random.key(0), x, bias)["params"], 0)
    logits = jnp.einsum("td,de->te", x.reshape(B * S, -1), p["router"])
    expert = np.asarray(route(cfg, logits, bias).expert)          # [T, k]
    t, k, E = S, cfg.top_k, cfg.n_experts
    cap = math.ceil(1.15 * t * k / E)
    dropped = sum(max(0, int(np.sum(expert[i * t:(i + 1) * t] == e)) - cap)
                  for i in range(B) for e in range(E))
    global_cap = math.ceil(1.15 * B * t * k / E)
    dropped_global = sum(max(0, int(np.sum(expert == e)) - global_cap) for e in range(E))
    assert dropped != dropped_global, (dropped, dropped_global)   # the test can tell them apart
    f = jax.jit(lambda p, x, b: layer.apply({"params": p}, x, b)[1]["drop_frac"])
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P(("data", "expert"))))
        frac8 = float(f(p, xs, bias))
    frac1 = float(f(p, x, bias))
    assert frac8 == dropped / (B * t * k), (frac8, dropped)
    assert frac1 == dropped_global / (B * t * k), (frac1, dropped_global)

    # 2. the new weights are FSDP-split on their width axis, never on a scanned stack axis
    rung = LADDERS["tiny"].rungs[0]
    sh = state_shardings(cfg, make_optimizer(rung.optimizer_settings), mesh)["params"]
    flat = {k: v.spec for k, v in flatten_dict(sh).items()}
    shapes = flatten_dict(model.param_shapes(cfg)[0])
    new = [k for k in flat if k[-1] in ("gate_down", "gate_up", "k_conv", "out_conv",
                                         "moe_conv", "attn_gate")]
    assert {k[-1] for k in new} == {"gate_down", "gate_up", "k_conv", "out_conv", "moe_conv",
                                    "attn_gate"}
    assert any(k[0] == "groups" for k in new) and any(k[0] == "layer_4" for k in new)
    for k in new:
        spec, shape = tuple(flat[k]), shapes[k].shape
        spec = spec + (None,) * (len(shape) - len(spec))
        stacked = 1 if k[0] == "groups" else 0
        split = [i for i, a in enumerate(spec) if a is not None]
        # one axis over all 8 devices, the widest one, never the scanned stack axis
        assert len(split) == 1 and split[0] >= stacked, (k, spec)
        assert spec[split[0]] == ("data", "expert"), (k, spec)
        assert shape[split[0]] == max(shape[stacked:]), (k, spec, shape)

    # 3. the whole model with every switch on: 8 devices = 1 device (capacity E/k: no drops)
    cfg = cfg.replace(capacity_factor=4.0)
    params, rb = model.init(cfg, 0)
    tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, cfg.vocab_size)
    step = jax.jit(jax.value_and_grad(lambda p, t: model.loss_fn(cfg, p, rb, t, t)[0]))
    l1, g1 = step(params, tokens)
    with jax.set_mesh(mesh):
        l8, g8 = step(jax.device_put(params, NamedSharding(mesh, P())),
                      jax.device_put(tokens, NamedSharding(mesh, P(("data", "expert")))))
    np.testing.assert_allclose(l8, l1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g8), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    print("ok")
""")


@pytest.mark.slow
def test_recipe_on_8_devices():
    assert run_on_fake_devices(SCRIPT).strip().endswith("ok")


@pytest.mark.parametrize("line, field", [('init = "xavier"', "recipe.init"),
                                         ('qk_norm = "none"', "recipe.qk_norm"),
                                         ("qk_mult = 0", "recipe.qk_mult"),
                                         ("conv_kernel = -2", "recipe.conv_kernel"),
                                         ("gated_norm_rank = 1.5", "recipe.gated_norm_rank"),
                                         ('xsa = "yes"', "recipe.xsa")])
def test_bad_switch_in_a_ladder_file_names_the_recipe_field(tmp_path, line, field):
    from ladder.io import InputError
    from ladder.specs import BUILTIN_DIR, load_ladder_file

    text = (Path(__file__).parents[1] / "ladder" / BUILTIN_DIR / "marin-535b.toml").read_text()
    key = line.split(" = ")[0]
    lines = [x for x in text.splitlines() if not x.startswith(f"{key} =")]
    f = tmp_path / "bad.toml"
    f.write_text("\n".join(lines).replace("[recipe]", f"[recipe]\n{line}", 1))
    with pytest.raises(InputError) as e:
        load_ladder_file(f)
    assert e.value.field == field and e.value.path == str(f)
