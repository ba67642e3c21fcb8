"""The decoder and the functional API the trainer uses: init, apply, loss_fn, param_groups.

Axis legend (as in model/config.py): B batch, S sequence, D model width, V vocab, E experts.
Einsum letters: b=B, s=S, d=D, v=V.

Parameters are a nested dict of float32 arrays, one sub-dict per layer (``layer_0`` ...; local
and global layers have different KV-head counts, so the layers are not stacked; an unrolled
Python loop compiles in seconds for the few layers the CPU ladders use). Routed-expert weights
keep a leading E axis. The router bias [n_layers, E] lives outside the params: it is an input of
every call and never differentiated.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.core import unfreeze
from flax.traverse_util import flatten_dict, unflatten_dict

from model.config import ModelConfig
from model.layers import Attention, RMSNorm, materialize, normal
from model.moe import MoE

AUX_KEYS = ("drop_frac", "load", "router_entropy", "router_z_loss", "balance_loss", "bias_target",
            "bias_stat")


class Block(nn.Module):
    cfg: ModelConfig
    layer: int

    @nn.compact
    def __call__(self, x, bias, dropless: bool):
        cfg = self.cfg
        x = x + Attention(cfg, self.layer, name="attn")(RMSNorm(cfg.norm_eps, name="attn_norm")(x))
        y, aux = MoE(cfg, name="moe")(RMSNorm(cfg.norm_eps, name="moe_norm")(x), bias, dropless)
        return x + y, aux


class Decoder(nn.Module):
    """tokens [B, S] int32, router_bias [n_layers, E] -> (logits [B, S, V] float32, aux)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, router_bias, dropless: bool = False):
        cfg = self.cfg
        init = normal(cfg.init_std)
        embedding = self.param("embedding", init, (cfg.vocab_size, cfg.d_model), jnp.float32)
        lm_head = self.param("lm_head", init, (cfg.d_model, cfg.vocab_size), jnp.float32)
        x = jnp.take(embedding, tokens, axis=0)                          # [B, S, D]
        auxes = []
        for layer in range(cfg.n_layers):
            x, aux = Block(cfg, layer, name=f"layer_{layer}")(x, router_bias[layer], dropless)
            auxes.append(aux)
        x = RMSNorm(cfg.norm_eps, name="final_norm")(x)
        logits = jnp.einsum("bsd,dv->bsv", x, lm_head).astype(jnp.float32)   # [B, S, V]
        # per-layer stats on a leading layer axis: scalars -> [n_layers], load -> [n_layers, E]
        return logits, {k: jnp.stack([a[k] for a in auxes]) for k in AUX_KEYS}


def _boxed_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Linen's init: params boxed in :class:`model.layers.Init` (value + init rule)."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    bias = jnp.zeros((cfg.n_layers, cfg.n_experts), jnp.float32)
    return unfreeze(Decoder(cfg).init(key, tokens, bias)["params"])


def _abstract_boxes(cfg: ModelConfig) -> dict:
    """{path: Init(ShapeDtypeStruct, std)} from an abstract trace: nothing is allocated."""
    return flatten_dict(jax.eval_shape(partial(_boxed_params, cfg), jax.random.key(0)))


def init(cfg: ModelConfig, seed: int):
    """-> (params, router_bias): params a nested dict of float32 arrays, router_bias zeros
    [n_layers, n_experts].

    Shapes and init rules come from the modules (an abstract trace, see model.layers.Init); the
    values are drawn with numpy by :func:`model.layers.materialize`.
    """
    boxes = jax.eval_shape(partial(_boxed_params, cfg), jax.random.key(0))
    return materialize(boxes, seed), jnp.zeros((cfg.n_layers, cfg.n_experts), jnp.float32)


def param_shapes(cfg: ModelConfig):
    """(params, router_bias) as jax.ShapeDtypeStruct trees, without allocating anything."""
    params = unflatten_dict({path: box.value for path, box in _abstract_boxes(cfg).items()})
    return params, jax.ShapeDtypeStruct((cfg.n_layers, cfg.n_experts), jnp.float32)


def apply(cfg: ModelConfig, params, router_bias, tokens, *, dropless: bool = False):
    """tokens int32 [B, S] -> (logits float32 [B, S, V], aux): aux holds the MoE statistics of
    every layer stacked on a leading layer axis (see model.moe.moe_stats)."""
    return Decoder(cfg).apply({"params": params}, tokens, router_bias, dropless)


def loss_fn(cfg: ModelConfig, params, router_bias, tokens, targets, *, dropless: bool = False):
    """-> (loss, stats). loss = mean cross-entropy + z_loss * mean(logsumexp(logits)^2), the only
    differentiated quantity. The router z-loss and the balance loss are returned for logging only.

    stats: "ce", "z_loss" (the weighted term, so loss = ce + z_loss), "moe/drop_frac" (over all
    layers' assignments), "moe/load_max_over_mean" (the worst layer's max/mean expert load),
    "moe/router_entropy", "moe/router_z_loss", "moe/balance_loss" (means over layers), and the
    per-layer arrays "moe/load" [L, E] (assignment counts), "moe/bias_target" [L, E] and the
    balancing rule's mergeable statistic "moe/bias_stat" (see model.moe.bias_stat).
    """
    logits, aux = apply(cfg, params, router_bias, tokens, dropless=dropless)
    lse = jax.nn.logsumexp(logits, axis=-1)                                # [B, S]
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]   # [B, S]
    ce = jnp.mean(lse - target_logit)
    z_loss = cfg.z_loss * jnp.mean(lse ** 2)
    load = aux["load"]                                                     # [L, E]
    stats = {
        "ce": ce,
        "z_loss": z_loss,
        # every layer routes the same number of assignments, so the mean is the overall fraction
        "moe/drop_frac": jnp.mean(aux["drop_frac"]),
        "moe/load_max_over_mean": jnp.max(jnp.max(load, axis=-1) / jnp.mean(load, axis=-1)),
        "moe/router_entropy": jnp.mean(aux["router_entropy"]),
        "moe/router_z_loss": jnp.mean(aux["router_z_loss"]),
        "moe/balance_loss": jnp.mean(aux["balance_loss"]),
        "moe/load": load,
        "moe/bias_target": aux["bias_target"],
        "moe/bias_stat": aux["bias_stat"],     # [L, E, n]: mergeable over microbatches (moe.py)
    }
    return ce + z_loss, stats


PARAM_GROUPS = ("embedding", "lm_head", "attention", "norms", "router", "latent",
                "shared_experts", "routed_experts")


def param_group(path: tuple[str, ...]) -> str:
    """The group (as in ladder/counting.py) of the parameter at ``path`` in the params dict.
    The final norm belongs to "norms" here (counting.py lists it separately as final_norm)."""
    top = path[0]
    if top in ("embedding", "lm_head"):
        return top
    if top == "final_norm":
        return "norms"
    part = path[1]                       # inside layer_i
    if part in ("attn_norm", "moe_norm"):
        return "norms"
    if part == "attn":
        return "attention"
    sub = path[2]                        # inside moe
    if sub == "router":
        return "router"
    if sub == "experts":
        return "routed_experts"
    if sub == "shared":
        return "shared_experts"
    return "latent"                      # down, up, latent_norm


def param_groups(params) -> dict[str, list]:
    """{group: [leaf, ...]} for the groups of PARAM_GROUPS (empty list if a group has none)."""
    groups: dict[str, list] = {g: [] for g in PARAM_GROUPS}
    for path, leaf in flatten_dict(params).items():
        groups[param_group(path)].append(leaf)
    return groups
