"""Flax MoE decoder in the shape of Marin's hero recipe, behind a small functional API.

    init(cfg, seed) -> (params, router_bias); init_sharded(cfg, seed, shardings): the same
        values, each process drawing only its own devices' shards
    apply(cfg, params, router_bias, tokens, *, dropless=False, segment_ids=None) -> (logits, aux)
    loss_fn(cfg, params, router_bias, tokens, targets, *, dropless=False, segment_ids=None)
        -> (loss, stats)
    update_router_bias(cfg, router_bias, stats, router_step=None) -> router_bias
    param_groups(params) -> {group: [leaf, ...]}

Importing ``model`` alone imports only the config (no JAX); the functions load JAX on first use.
Files: config.py (switches, sizes), layers.py (norms, RoPE, attention, init), moe.py (router,
dispatch, experts, bias rules), balance.py (the quantile rule), transformer.py (decoder, API).

Under ``jax.set_mesh`` of a mesh with "Auto" axes ("data", "expert") the MoE layers run
expert-parallel and GSPMD partitions the rest. "Explicit" axes (jax.make_mesh's default in jax
0.10) are not supported: the embedding gather would need out_sharding annotations.
"""

from ladder.model.config import BiasRule, ModelConfig, ModelSwitches

_LAZY = {**dict.fromkeys(("init", "init_sharded", "apply", "loss_fn", "param_groups",
                          "param_shapes", "PARAM_GROUPS"), "ladder.model.transformer"),
         "update_router_bias": "ladder.model.moe"}
__all__ = ["BiasRule", "ModelConfig", "ModelSwitches", *_LAZY]


def __getattr__(name):  # PEP 562: `from model import init` imports JAX only when asked for
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
