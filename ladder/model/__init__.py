"""Flax MoE decoder in the shape of Marin's hero recipe, behind a small functional API.

    init(cfg, seed) -> (params, router_bias)
    init_sharded(cfg, seed, shardings) -> (params placed with shardings, router_bias): the same
        values, each process drawing only its own devices' shards
    apply(cfg, params, router_bias, tokens, *, dropless=False, segment_ids=None) -> (logits, aux)
    loss_fn(cfg, params, router_bias, tokens, targets, *, dropless=False, segment_ids=None)
        -> (loss, stats)
    update_router_bias(cfg, router_bias, stats, router_step=None) -> router_bias (router_step:
        the step's change of the router weights, transformer.router_weights; taken off the
        balancing target so the bias does not lag the router by one step)
    param_groups(params) -> {group: [leaf, ...]}

Importing ``model`` alone imports only the config (no JAX); the functions load JAX on first use.

Files: config.py (ModelSwitches: the switches a ladder's recipe sets, ModelConfig: those plus
sizes and compute path, BiasRule), layers.py (RMSNorm, RoPE, attention, init boxes), moe.py (router,
dispatch, experts, bias rules, reference MoE), transformer.py (decoder, API, losses, groups).

Compute path (ladder/model/transformer.py): ``cfg.precision`` bf16 (accelerators) or f32 (CPU, and
wherever exactness is tested) with float32 master weights; attention through cuDNN flash
attention on GPU (documents as cuDNN's packed segments, never a dense mask), query blocks of
``cfg.attention_chunk`` through XLA elsewhere (ladder.model.layers.attention_choice says which,
once per process); whole repeats of the local/global layer pattern under nn.scan with
``cfg.remat``;
the LM head and cross-entropy over chunks of ``cfg.loss_chunk`` positions (no [B, S, V] logits
in loss_fn). ``segment_ids`` [B, S] keep packed documents from attending to each other.

Sharding: routed-expert weights carry an E axis (leading in unrolled layers, after the group axis
under scan: ladder.model.transformer.expert_axis); under ``jax.set_mesh`` of a mesh with "Auto" axes
("data", "expert") the MoE layers read the mesh from the context and run their routed path
expert-parallel (``jax.shard_map`` + a ragged all-to-all on GPU/TPU, ``all_to_all`` on CPU,
model/moe.py); jit/GSPMD partitions the rest
(tests/test_model_sharding.py). Meshes with "Explicit" axes (jax.make_mesh's default in jax 0.10)
are not supported: the embedding gather would need out_sharding annotations.

Left out of the real recipe (little effect on scaling behaviour, per issue #2): short
convolutions, gated norms, attention head gates. Also: no TPU splash kernel (TPUs take the
blocked XLA attention).
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
