"""The decoder and the functional API the trainer uses: init, apply, loss_fn, param_groups.

Axis legend (as in ladder/model/config.py): B batch, S sequence, D model width, V vocab, E experts.
Einsum letters: b=B, s=S, d=D, v=V.

Parameter layout (nested dict of float32 arrays). Layers repeat the pattern [local] *
(global_every - 1) + [global]; the ``cfg.n_groups`` whole repeats run under ``nn.scan`` (compile
time does not grow with depth): ``groups/block_j/...`` [n_groups, ...] holds layer
``g * global_every + j`` at index g; the layers after them are unrolled as ``layer_i/...``. The
router bias [n_layers, E] is an input of every call, never differentiated.

Precision (``cfg.precision``): parameters are float32 masters; "bf16" casts each block's weights
on read, except norm scales and the router (router logits, norm statistics, attention softmax
and the loss are float32).
"""

from __future__ import annotations

from functools import lru_cache, partial

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.core import unfreeze
from flax.traverse_util import flatten_dict, unflatten_dict

from ladder.model.config import ModelConfig, resolve_precision
from ladder.model.layers import (
    Attention,
    GatedRMSNorm,
    causal_conv,
    materialize,
    materialize_sharded,
    weight_init,
    zeros,
)
from ladder.model.moe import ROUTED_NAME, MoE, split_batch

AUX_KEYS = ("drop_frac", "load", "prob", "router_entropy", "router_z_loss", "balance_loss",
            "bias_target", "bias_stat", "router_in")
DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}
# What a block keeps for the backward pass under remat "dots": the outputs of the weight matmuls
# (dots without batch dimensions) and the routed path's output (moe.ROUTED_NAME; that path
# recomputes itself late, moe.recompute_at_backward). Remat "full": call_block.
REMAT_POLICIES = {"dots": jax.checkpoint_policies.save_from_both_policies(
    jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    jax.checkpoint_policies.save_only_these_names(ROUTED_NAME))}


def compute_dtype(cfg: ModelConfig):
    """The activation/matmul dtype of ``cfg`` on the default backend ("auto" resolved)."""
    return DTYPES[resolve_precision(cfg.precision, jax.default_backend())]


def cast_params(tree, dtype):
    """Every parameter in ``dtype`` except the norm scales and the router weight."""
    if dtype == jnp.float32:
        return tree
    flat = flatten_dict(unfreeze(tree))
    return unflatten_dict({p: x if p[-1] in ("scale", "router") else x.astype(dtype)
                           for p, x in flat.items()})


class Block(nn.Module):
    """RMSNorm -> attention -> residual, RMSNorm -> MoE -> residual. ``layer``: the layer's index,
    or in a scanned group its position (which sets local/global alike)."""

    cfg: ModelConfig
    layer: int
    dropless: bool = False

    @nn.compact
    def __call__(self, x, bias, segment_ids=None):
        cfg = self.cfg
        x = split_batch(x)                  # the residual stream: rows split over the devices
        h = GatedRMSNorm(cfg, name="attn_norm")(x)
        x = x + Attention(cfg, self.layer, name="attn")(h, segment_ids)
        y, aux = MoE(cfg, name="moe")(GatedRMSNorm(cfg, name="moe_norm")(x), bias,
                                      self.dropless)
        if cfg.conv_kernel:   # the recipe's short convolution at the MoE output (model/layers.py)
            y = causal_conv(y, self.param("moe_conv", zeros, (cfg.conv_kernel, cfg.d_model),
                                          jnp.float32), segment_ids)
        return x + y.astype(x.dtype), aux


def _block_class(cfg: ModelConfig, *, in_scan: bool):
    """Block with ``cfg``'s precision cast (on read, inside remat: recomputed, not stored) and
    remat policy."""
    cls = Block
    dtype = compute_dtype(cfg)
    if dtype != jnp.float32:
        cls = nn.map_variables(cls, "params", trans_in_fn=partial(cast_params, dtype=dtype))
    if cfg.remat == "dots":
        # prevent_cse guards remat against XLA's CSE; under scan the loop already does (flax doc)
        cls = nn.remat(cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not in_scan)
    return cls


def call_block(cls, cfg: ModelConfig, layer: int, dropless: bool, name: str, x, bias,
               segment_ids):
    """``cls(cfg, layer, dropless, name=name)(x, bias, segment_ids)``; with remat "full" the
    block keeps only its input and parameters and is recomputed once its output's cotangent
    exists (moe.after_cotangent): under ``nn.remat`` XLA:CPU ran every block of a scanned group
    at the start of its backward pass (27.7B-A1.2B: 53 GiB at the peak; docs/LOG.md)."""
    block = cls(cfg, layer, dropless, name=name)
    if cfg.remat != "full":
        return block(x, bias, segment_ids)
    from ladder.model.moe import _DROP_SEED, after_cotangent, drop_order

    def fwd(mdl, x, bias, segment_ids):
        out = mdl(x, bias, segment_ids)
        seed = jnp.asarray(_DROP_SEED.get(), jnp.int32)
        return out, (mdl.variables["params"], x, bias, segment_ids, seed)

    def bwd(res, ct):
        params, x, bias, segment_ids, seed = res
        (x,) = after_cotangent(ct, x)

        def run(p, x, bias):
            with drop_order(seed):
                return cls(cfg, layer, dropless).apply({"params": p}, x, bias, segment_ids)

        params_ct, x_ct, bias_ct = jax.vjp(run, params, x, bias)[1](ct)
        return {"params": params_ct}, x_ct, bias_ct, None

    return nn.custom_vjp(lambda mdl, *args: mdl(*args), forward_fn=fwd,
                         backward_fn=bwd)(block, x, bias, segment_ids)


class Group(nn.Module):
    """``global_every`` blocks, the last one global: (x, bias [global_every, E]) -> (x, aux
    stacked on a leading [global_every] axis)."""

    cfg: ModelConfig
    dropless: bool = False

    @nn.compact
    def __call__(self, x, bias, segment_ids):
        cls = _block_class(self.cfg, in_scan=True)
        auxes = []
        for j in range(self.cfg.global_every):
            x, aux = call_block(cls, self.cfg, j, self.dropless, f"block_{j}", x, bias[j],
                                segment_ids)
            auxes.append(aux)
        return x, {k: jnp.stack([a[k] for a in auxes]) for k in AUX_KEYS}


class Decoder(nn.Module):
    """tokens [B, S] int32, router_bias [n_layers, E], segment_ids [B, S] or None ->
    (h [B, S, D] after the final norm, in the compute dtype, aux). The LM head is a parameter
    of this module but is applied by :func:`apply` / :func:`loss_fn`."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, router_bias, dropless: bool = False, segment_ids=None):
        cfg = self.cfg
        init = weight_init(cfg)
        embedding = self.param("embedding", init, (cfg.vocab_size, cfg.d_model), jnp.float32)
        self.param("lm_head", init, (cfg.d_model, cfg.vocab_size), jnp.float32)
        # gather from the float32 table, then cast: the embedding gradient (a scatter-add over
        # every position) then accumulates in float32
        x = split_batch(jnp.take(embedding, tokens, axis=0).astype(compute_dtype(cfg)))  # [B, S, D]
        if cfg.embed_norm:
            x = GatedRMSNorm(cfg, name="embed_norm")(x)
        auxes = []
        n_scan, g = cfg.scanned_layers, cfg.global_every
        if cfg.n_groups:
            groups = nn.scan(Group, variable_axes={"params": 0}, split_rngs={"params": True},
                             in_axes=(0, nn.broadcast), length=cfg.n_groups)
            bias = router_bias[:n_scan].reshape(cfg.n_groups, g, -1)     # [L, E] -> [G, g, E]
            x, aux = groups(cfg, dropless, name="groups")(x, bias, segment_ids)
            # [G, g, ...] -> [G * g, ...]: layer order
            auxes.append({k: v.reshape((n_scan,) + v.shape[2:]) for k, v in aux.items()})
        cls = _block_class(cfg, in_scan=False)
        for layer in range(n_scan, cfg.n_layers):
            x, aux = call_block(cls, cfg, layer, dropless, f"layer_{layer}", x,
                                router_bias[layer], segment_ids)
            auxes.append({k: v[None] for k, v in aux.items()})
        x = GatedRMSNorm(cfg, name="final_norm")(split_batch(x))
        # per-layer stats on a leading layer axis: scalars -> [n_layers], load -> [n_layers, E]
        return x, {k: jnp.concatenate([a[k] for a in auxes]) for k in AUX_KEYS}


@lru_cache(maxsize=8)
def _boxes(cfg: ModelConfig) -> dict:
    """Nested {name: Init(ShapeDtypeStruct, std)} (:class:`model.layers.Init`) from an abstract
    trace of linen's init. Cached: tracing takes seconds, and a run needs it twice."""
    # none of these changes a parameter's shape or init rule
    cfg = cfg.replace(precision="f32", remat="none", capacity_tokens=None)

    def boxed(key):
        tokens = jnp.zeros((1, 1), jnp.int32)
        bias = jnp.zeros((cfg.n_layers, cfg.n_experts), jnp.float32)
        return unfreeze(Decoder(cfg).init(key, tokens, bias)["params"])

    return jax.eval_shape(boxed, jax.random.key(0))


def init(cfg: ModelConfig, seed: int):
    """-> (params, router_bias): params a nested dict of float32 arrays drawn with numpy
    (ladder.model.layers.materialize), router_bias zeros [n_layers, n_experts]."""
    return (materialize(_boxes(cfg), seed, partial(_unrolled_paths, cfg)),
            jnp.zeros((cfg.n_layers, cfg.n_experts), jnp.float32))


def init_sharded(cfg: ModelConfig, seed: int, shardings):
    """:func:`init`'s values placed with ``shardings`` (a params-shaped tree), each process
    drawing only its own devices' shards (the 27.7B-A1.2B model is 111 GB in float32); the
    router bias is not placed."""
    return (materialize_sharded(_boxes(cfg), seed, shardings, partial(_unrolled_paths, cfg)),
            jnp.zeros((cfg.n_layers, cfg.n_experts), jnp.float32))


def _unrolled_paths(cfg: ModelConfig, path: tuple[str, ...]):
    """The unrolled paths of a scanned parameter's slices (groups/block_j/... [G, ...] ->
    layer_{g * global_every + j}/...), so both layouts start alike; None if not scanned."""
    if path[0] != "groups":
        return None
    j = int(path[1].removeprefix("block_"))
    return [(f"layer_{g * cfg.global_every + j}",) + path[2:] for g in range(cfg.n_groups)]


def param_shapes(cfg: ModelConfig):
    """(params, router_bias) as jax.ShapeDtypeStruct trees, without allocating anything."""
    params = unflatten_dict({path: box.value for path, box in flatten_dict(_boxes(cfg)).items()})
    return params, jax.ShapeDtypeStruct((cfg.n_layers, cfg.n_experts), jnp.float32)


def _hidden(cfg, params, router_bias, tokens, dropless, segment_ids):
    if segment_ids is not None and segment_ids.shape != tokens.shape:
        raise ValueError(f"segment_ids: shape {segment_ids.shape} != tokens {tokens.shape}")
    return Decoder(cfg).apply({"params": params}, tokens, router_bias, dropless, segment_ids)


def apply(cfg: ModelConfig, params, router_bias, tokens, *, dropless: bool = False,
          segment_ids=None):
    """tokens int32 [B, S] -> (logits float32 [B, S, V], aux): every layer's moe.moe_stats on a
    leading layer axis. ``segment_ids`` [B, S] int32: tokens attend only within their segment
    (None: the row is one segment)."""
    h, aux = _hidden(cfg, params, router_bias, tokens, dropless, segment_ids)
    w = params["lm_head"].astype(h.dtype)
    return jnp.einsum("bsd,dv->bsv", h, w, preferred_element_type=jnp.float32), aux


def lm_head_losses(h, lm_head, targets, chunk: int):
    """h [B, S, D], lm_head [D, V] float32 (cast per chunk: its gradient accumulates in float32),
    targets [B, S] -> (ce_sum, lse_sq_sum) float32: sums of (logsumexp - target logit) and
    logsumexp^2 over chunks of ``chunk`` positions, one [B, chunk, V] block of logits at a time
    (jax.checkpoint recomputes it in the backward pass)."""
    B, S, D = h.shape
    c = min(chunk, S)
    n = -(-S // c)
    pad = n * c - S
    valid = jnp.ones((B, S), jnp.float32)
    if pad:
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        valid = jnp.pad(valid, ((0, 0), (0, pad)))

    def chunks(a):                    # [B, n*c, ...] -> [n, B, c, ...]
        return jnp.moveaxis(a.reshape((B, n, c) + a.shape[2:]), 1, 0)

    @jax.checkpoint
    def body(carry, xs):
        hc, tc, vc = xs                                                    # [B, c, D], [B, c]
        logits = jnp.einsum("bsd,dv->bsv", hc, lm_head.astype(hc.dtype),
                            preferred_element_type=jnp.float32)            # [B, c, V]
        lse = jax.nn.logsumexp(logits, axis=-1)                            # [B, c]
        target = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]   # [B, c]
        ce_sum, sq_sum = carry
        return (ce_sum + jnp.sum((lse - target) * vc), sq_sum + jnp.sum(lse ** 2 * vc)), None

    zero = jnp.zeros((), jnp.float32)
    (ce_sum, sq_sum), _ = jax.lax.scan(body, (zero, zero),
                                       (chunks(h), chunks(targets), chunks(valid)))
    return ce_sum, sq_sum


def loss_fn(cfg: ModelConfig, params, router_bias, tokens, targets, *, dropless: bool = False,
            segment_ids=None):
    """-> (loss, stats). loss = mean cross-entropy + z_loss * mean(logsumexp(logits)^2), the only
    differentiated quantity (router z-loss and balance loss are logged only), over chunks of
    ``cfg.loss_chunk`` positions (:func:`lm_head_losses`: no [B, S, V] logits). stats: "ce",
    "z_loss" (the weighted term), means over layers of the moe.moe_stats scalars, the worst
    layer's max/mean expert load, and per-layer arrays [L, ...]."""
    h, aux = _hidden(cfg, params, router_bias, tokens, dropless, segment_ids)
    ce_sum, sq_sum = lm_head_losses(h, params["lm_head"], targets, cfg.loss_chunk)
    n_pos = tokens.shape[0] * tokens.shape[1]
    ce = ce_sum / n_pos
    z_loss = cfg.z_loss * (sq_sum / n_pos)
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
        "moe/router_prob": aux["prob"],
        "moe/bias_target": aux["bias_target"],
        "moe/bias_stat": aux["bias_stat"],     # [L, E, n]: mergeable over microbatches (moe.py)
        "moe/router_in": aux["router_in"],     # [L, D]: each router's mean input (moe.py)
    }
    return ce + z_loss, stats


PARAM_GROUPS = ("embedding", "lm_head", "attention", "norms", "router", "latent",
                "shared_experts", "routed_experts", "gated_norms", "convs", "head_gates")
# The group of a parameter: by its leaf name (the recipe's pieces, wherever they sit), else by its
# top-level name, else by its part of a layer, else by its part of the layer's MoE.
LEAF_GROUPS = {"gate_down": "gated_norms", "gate_up": "gated_norms", "k_conv": "convs",
               "out_conv": "convs", "moe_conv": "convs", "attn_gate": "head_gates"}
TOP_GROUPS = {"embedding": "embedding", "lm_head": "lm_head", "final_norm": "norms",
              "embed_norm": "norms"}
LAYER_GROUPS = {"attn_norm": "norms", "moe_norm": "norms", "attn": "attention"}
MOE_GROUPS = {"router": "router", "experts": "routed_experts", "shared": "shared_experts"}


def stacked_axes(path: tuple[str, ...]) -> int:
    """Leading layer-stack axes of the parameter at ``path``: 1 under the scanned ``groups``
    ([n_groups, ...]), else 0."""
    return 1 if path[0] == "groups" else 0


expert_axis = stacked_axes   # a routed-expert weight's E axis comes right after its stack axes


def param_group(path: tuple[str, ...]) -> str:
    """The group (as in ladder/counting.py) of the parameter at ``path`` in the params dict."""
    path = tuple(path)
    if path[-1] in LEAF_GROUPS:
        return LEAF_GROUPS[path[-1]]
    if path[0] in TOP_GROUPS:
        return TOP_GROUPS[path[0]]
    if path[0] == "groups":              # groups/block_j/... reads like layer_i/...
        path = path[1:]
    # inside moe, the rest (down, up, latent_norm) is the latent projection's
    return LAYER_GROUPS.get(path[1]) or MOE_GROUPS.get(path[2], "latent")


OPTIONAL_GROUPS = ("gated_norms", "convs", "head_gates")   # only a model with the switches on


def param_groups(params) -> dict[str, list]:
    """{group: [leaf, ...]} for the groups of PARAM_GROUPS (empty list if a group has none),
    except the recipe's optional groups, present only when the model has them."""
    groups: dict[str, list] = {g: [] for g in PARAM_GROUPS}
    for path, leaf in flatten_dict(params).items():
        groups[param_group(path)].append(leaf)
    return {g: v for g, v in groups.items() if v or g not in OPTIONAL_GROUPS}


def router_weights(cfg: ModelConfig, params) -> jax.Array:
    """Every layer's router weight in layer order: [n_layers, D, E] (the scanned groups' blocks
    [G, D, E] interleaved back into layers g * global_every + j, then the unrolled layers)."""
    parts = []
    if cfg.n_groups:
        blocks = [params["groups"][f"block_{j}"]["moe"]["router"]
                  for j in range(cfg.global_every)]                    # each [G, D, E]
        stacked = jnp.stack(blocks, axis=1)                              # [G, g, D, E]
        parts.append(stacked.reshape((cfg.scanned_layers,) + stacked.shape[2:]))
    for layer in range(cfg.scanned_layers, cfg.n_layers):
        parts.append(params[f"layer_{layer}"]["moe"]["router"][None])    # [1, D, E]
    return jnp.concatenate(parts)
