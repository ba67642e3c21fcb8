"""Flax MoE decoder in the shape of Marin's hero recipe, behind a small functional API.

    init(cfg, seed) -> (params, router_bias); init_sharded(cfg, seed, shardings): the same
        values, each process drawing only its own devices' shards
    apply(cfg, params, router_bias, tokens, *, dropless=False, segment_ids=None) -> (logits, aux)
    loss_fn(cfg, params, router_bias, tokens, targets, *, dropless=False, segment_ids=None)
        -> (loss, stats)
    update_router_bias(cfg, router_bias, stats, router_step=None) -> router_bias
    param_groups(params) -> {group: [leaf, ...]}

Importing ``model`` alone imports only the config (no JAX); the functions load JAX on first use.

Files: config.py (ModelSwitches: the switches a ladder's recipe sets, ModelConfig: those plus
sizes and compute path, BiasRule), layers.py (norms, RoPE, attention, init boxes), moe.py
(router, dispatch, experts, bias rules, reference MoE, expert parallelism), balance.py (the
quantile bias rule), transformer.py (decoder, API, losses, parameter layout and precision).

Under ``jax.set_mesh`` of a mesh with "Auto" axes ("data", "expert") the MoE layers run their
routed path expert-parallel and jit/GSPMD partitions the rest (tests/test_model_sharding.py).
Meshes with "Explicit" axes (jax.make_mesh's default in jax 0.10) are not supported: the
embedding gather would need out_sharding annotations.
"""

from ladder.model.config import BiasRule, ModelConfig, ModelSwitches

__all__ = [
    "PARAM_GROUPS",
    "BiasRule",
    "ModelConfig",
    "ModelSwitches",
    "apply",
    "init",
    "init_sharded",
    "loss_fn",
    "param_groups",
    "param_shapes",
    "update_router_bias",
]

_LAZY = {"init": "ladder.model.transformer", "init_sharded": "ladder.model.transformer",
         "apply": "ladder.model.transformer", "loss_fn": "ladder.model.transformer",
         "param_groups": "ladder.model.transformer", "param_shapes": "ladder.model.transformer",
         "PARAM_GROUPS": "ladder.model.transformer", "update_router_bias": "ladder.model.moe"}


def __getattr__(name):  # PEP 562: `from model import init` imports JAX only when asked for
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
