"""The train step and its mesh: the programs a run compiles, with no run directory in sight.

``programs(model_cfg, mesh, optimizer, microbatches)`` returns the jitted ``train_step(state,
batch) -> (state, metrics)`` (state donated), ``eval_step`` and the state's shardings, cached per
process. The mesh has axes ("data", "expert"): the batch is split over every device, routed-expert
weights over "expert" (the MoE layer goes expert-parallel under the mesh, model/moe.py), every
other weight and its optimizer moments FSDP-style over all devices. A step may run its batch in
microbatches (:func:`accumulate`); the balancing rule still sees the whole step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ladder.io import EX_USAGE, InputError
from ladder.model.config import ModelConfig
from ladder.trainer.optim import OptimizerSettings, make_optimizer  # noqa: F401  (re-exported)


def enable_compilation_cache() -> str | None:
    """Persist compiled XLA programs across processes (a rung's step compiles in 5-20 s on 2 busy
    CPU cores, measured here, and a re-run, a resume or a test re-uses them). Directory:
    $LADDER_JAX_CACHE (``0`` disables), else ~/.cache/ladder/jax. An already configured JAX
    cache is left alone."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    path = os.environ.get("LADDER_JAX_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "ladder", "jax"))
    if not path or path == "0":
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path


BATCH_AXES = ("data", "expert")   # dense work: the batch is split over every device


def default_expert_axis(devices: int, n_experts: int) -> int:
    """The default "expert" mesh axis: the largest divisor of the device count that also
    divides the number of experts."""
    return max(e for e in range(1, devices + 1) if devices % e == 0 and n_experts % e == 0)


def make_mesh(n_devices: int | None, expert_parallel: int | None, n_experts: int, batch: int):
    """A ("data", "expert") mesh (the default expert axis: :func:`default_expert_axis`).
    ``batch`` (the sequences of one microbatch) is split over ALL devices (data x expert)."""
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    n = n_devices or len(devices)
    if n > len(devices):
        raise InputError(f"{n} devices requested, {len(devices)} visible", field="devices",
                         exit_code=EX_USAGE)
    ep = default_expert_axis(n, n_experts) if expert_parallel is None else expert_parallel
    if n % ep or n_experts % ep:
        raise InputError(f"expert axis {ep} must divide both the devices ({n}) and the experts "
                         f"({n_experts})", field="expert_parallel", exit_code=EX_USAGE)
    if batch % n:
        raise InputError(f"the {n} devices must divide the sequences of a microbatch ({batch}): "
                         f"the batch is split over all of them", field="microbatch",
                         exit_code=EX_USAGE)
    return Mesh(np.array(devices[:n]).reshape(n // ep, ep), ("data", "expert"))


def _fsdp_spec(shape: tuple, fixed: dict, mesh):
    """PartitionSpec splitting the largest axis of ``shape`` (not in ``fixed``) that the mesh's
    remaining axes divide over those axes (FSDP-style: GSPMD gathers the weight where it is used
    and reduce-scatters its gradient); ``fixed`` maps axis index -> mesh axis already used."""
    from jax.sharding import PartitionSpec as P

    free = tuple(a for a in BATCH_AXES if a not in fixed.values() and mesh.shape[a] > 1)
    size = int(np.prod([mesh.shape[a] for a in free])) if free else 1
    spec = [fixed.get(i) for i in range(len(shape))]
    if size > 1:
        axes = [i for i in range(len(shape)) if i not in fixed and shape[i] % size == 0]
        if axes:
            spec[max(axes, key=lambda i: shape[i])] = free if len(free) > 1 else free[0]
    return P(*spec)


def _param_shardings(params, groups, mesh, n_experts: int):
    """Routed-expert weights split on their E axis over "expert" (and FSDP-style over "data" on
    another axis); every other weight FSDP-style over all devices (replicated when no axis
    divides, e.g. norm scales of odd width). The E axis: model.transformer.expert_axis; a
    scanned group's stack axis is never split (scan slices it)."""
    import jax
    from jax.sharding import NamedSharding

    from ladder.model.transformer import expert_axis, stacked_axes

    routed = {id(x) for x in groups["routed_experts"]}

    def spec(path, x):
        names = tuple(k.key for k in path)
        fixed = {i: None for i in range(stacked_axes(names))}
        if id(x) in routed:
            axis = expert_axis(names)
            if x.shape[axis] != n_experts:
                raise ValueError(f"routed expert weight {'/'.join(names)} of shape {x.shape} has "
                                 f"no E axis at {axis}")
            fixed[axis] = "expert"
        return NamedSharding(mesh, _fsdp_spec(x.shape, fixed, mesh))
    return jax.tree_util.tree_map_with_path(spec, params)


def state_shardings(model_cfg: ModelConfig, optimizer, mesh) -> dict:
    """Shardings of the train state from abstract shapes: parameters and their optimizer
    moments as :func:`_param_shardings`, the step and router bias replicated."""
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import ladder.model as M

    params, _ = M.param_shapes(model_cfg)
    pshard = _param_shardings(params, M.param_groups(params), mesh, model_cfg.n_experts)
    repl = NamedSharding(mesh, P())
    opt_state = jax.eval_shape(optimizer.init, params)
    # a moment tree may hold None where a leaf keeps no such moment (marin: no second moment
    # on MuonH leaves, ladder/trainer/optim.py): no sharding there either
    oshard = optax.tree_utils.tree_map_params(
        optimizer, lambda x, s: None if x is None else s, opt_state, pshard,
        transform_non_params=lambda _: repl, is_leaf=lambda x: x is None)
    return {"step": repl, "params": pshard, "opt_state": oshard, "router_bias": repl}


def batch_sharding(mesh):
    """Sequences split over every device of the mesh (data x expert)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh, P(BATCH_AXES))


@dataclass
class Programs:
    """The jitted programs of one (model, optimizer, mesh, microbatches); cached per process, so
    a resumed or repeated run in the same process does not trace the model again."""

    model_cfg: ModelConfig
    optimizer: object
    shardings: dict
    train_step: Callable     # jitted train_step(state, batch) -> (state, metrics), state donated
    eval_step: Callable      # jitted eval_step(params, router_bias, batch) -> dict
    init_opt: Callable       # jitted optimizer.init with the opt_state shardings
    _compiled: dict = field(default_factory=dict)

    def init_state(self, seed: int) -> dict:
        """Fresh train state on the mesh: step, params, opt_state, router_bias. Each process
        draws only its own devices' shards of the parameters (model.init_sharded)."""
        import jax
        import jax.numpy as jnp

        import ladder.model as M

        params, router_bias = M.init_sharded(self.model_cfg, seed, self.shardings["params"])
        return {"step": jax.device_put(jnp.zeros((), jnp.int32), self.shardings["step"]),
                "params": params, "opt_state": self.init_opt(params),
                "router_bias": jax.device_put(jnp.asarray(router_bias, jnp.float32),
                                              self.shardings["router_bias"])}

    def abstract_state(self) -> dict:
        """The train state as ShapeDtypeStructs with their shardings (nothing allocated)."""
        import jax
        import jax.numpy as jnp

        import ladder.model as M

        params, bias = M.param_shapes(self.model_cfg)
        shapes = {"step": jax.ShapeDtypeStruct((), jnp.int32), "params": params,
                  "opt_state": jax.eval_shape(self.optimizer.init, params),
                  "router_bias": bias}
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            shapes, self.shardings)

    def compiled_step(self, state, batch):
        """The train step compiled ahead of time for these shapes (a step's time never
        includes compilation)."""
        key = tuple((k, v.shape, str(v.dtype)) for k, v in sorted(batch.items()))
        if key not in self._compiled:
            self._compiled[key] = self.train_step.lower(state, batch).compile()
        return self._compiled[key]


def programs(model_cfg: ModelConfig, mesh, optimizer: OptimizerSettings | None = None,
             microbatches: int = 1) -> Programs:
    """The programs for ``model_cfg`` on ``mesh``, the step's batch split into ``microbatches``.
    ``optimizer``: the rung's resolved settings (``Rung.optimizer_settings``); None = AdamW with
    its default numbers (the LR enters per step, so no rung is needed)."""
    if optimizer is None:
        from ladder.trainer.optim import OptimizerSpec
        optimizer = OptimizerSpec().settings(1.0, 1, 1)
    return _programs(model_cfg, optimizer, mesh, microbatches)


@lru_cache(maxsize=4)
def _programs(model_cfg: ModelConfig, settings: OptimizerSettings, mesh,
              microbatches: int) -> Programs:
    import jax

    from ladder.trainer.optim import warn_init

    warn_init(settings.kind, model_cfg)       # once per program (lru_cache)
    optimizer = make_optimizer(settings)
    shard = state_shardings(model_cfg, optimizer, mesh)
    return Programs(model_cfg, optimizer, shard,
                    make_train_step(model_cfg, optimizer, shard, mesh, microbatches),
                    make_eval_step(model_cfg, mesh),
                    jax.jit(optimizer.init, out_shardings=shard["opt_state"]))


# Statistics of a microbatch that are means over its tokens (equal-sized microbatches: the step's
# value is their mean, exactly) and those that are sums.
_MEAN_STATS = ("ce", "z_loss", "moe/drop_frac", "moe/router_z_loss", "moe/router_prob",
               "moe/router_in")
_SUM_STATS = ("moe/load",)


def accumulate(model_cfg: ModelConfig, objective, params, tokens, targets, microbatches: int,
               param_shardings=None, mesh=None, segment_ids=None):
    """Loss, stats and gradients of the mean loss over ``tokens`` [B, S] (and ``segment_ids``,
    or None), computed in ``microbatches`` equal parts under ``jax.lax.scan`` (gradients summed
    in float32); ``objective(params, tokens, targets, segment_ids) -> (loss, stats)``.

    Microbatch j holds the consecutive sequences j B/M .. (j + 1) B/M - 1, split over the devices
    like the batch: a capacity cell of several sequences (ladder/model/moe.py) is then the same
    sequences whatever the microbatch and the device count (issue 22 item 2; the rows move for
    it: 16 MiB of int32 a step at 1024 x 4096). Means over tokens are averaged, counts summed,
    and the balancing rule's statistic merged by the rule's own function (moe.merge_bias_stat),
    so the bias target, the router entropy and the balance loss are the whole step's."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ladder.model.moe import (
        balance_loss,
        bias_target_from_stat,
        empty_bias_stat,
        load_entropy,
        merge_bias_stat,
    )

    grad_fn = jax.value_and_grad(objective, has_aux=True)
    if microbatches == 1:
        return grad_fn(params, tokens, targets, segment_ids)
    B, S = tokens.shape
    M = microbatches

    def split(x):   # [B, S] -> [M, B/M, S]; row j*B/M + i -> microbatch j
        x = x.reshape(M, B // M, S)
        if mesh is not None:
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, BATCH_AXES)))
        return x

    shapes = jax.eval_shape(objective, params, tokens[: B // M], targets[: B // M],
                            None if segment_ids is None else segment_ids[: B // M])[1]
    zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if param_shardings is not None:
        zero_grads = jax.lax.with_sharding_constraint(zero_grads, param_shardings)

    def split_experts(stat):
        # the balancing statistic [layers, E, n] stays split over "expert" on its E axis
        if mesh is None:
            return stat
        return jax.lax.with_sharding_constraint(stat, NamedSharding(mesh, P(None, "expert")))

    def merge(stat, new):
        # each device merges its own experts' rows: GSPMD does not partition top_k and gathered
        # the whole [layers, E, 2n] operand on every device (measured with `ladder plan
        # --compile`: +3.6 GB per layer for 27.7B-A1.2B on 64 devices, n = 961K)
        if mesh is None or mesh.size == 1:
            return merge_bias_stat(model_cfg, stat, new)
        spec = P(None, "expert")
        return jax.shard_map(lambda a, b: merge_bias_stat(model_cfg, a, b), mesh=mesh,
                             in_specs=(spec, spec), out_specs=spec, check_vma=False)(stat, new)

    carry = (zero_grads, jnp.zeros((), jnp.float32),
             {k: jnp.zeros(shapes[k].shape, jnp.float32) for k in _MEAN_STATS + _SUM_STATS},
             split_experts(empty_bias_stat(model_cfg, shapes["moe/bias_stat"].shape)))

    def body(carry, mb):
        grads, loss_sum, sums, stat = carry
        (loss, st), g = grad_fn(params, *mb)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        sums = {k: sums[k] + st[k] for k in sums}
        stat = merge(stat, split_experts(st["moe/bias_stat"]))
        return (grads, loss_sum + loss, sums, stat), None

    xs = (split(tokens), split(targets), None if segment_ids is None else split(segment_ids))
    (grads, loss_sum, sums, stat), _ = jax.lax.scan(body, carry, xs)
    grads = jax.tree.map(lambda g: g / M, grads)
    stats = {k: sums[k] / M for k in _MEAN_STATS}
    load = sums["moe/load"]                                                    # [L, E]
    stats.update({"moe/load": load, "moe/bias_stat": stat,
                  "moe/router_entropy": jnp.mean(load_entropy(load)),
                  "moe/balance_loss": jnp.mean(balance_loss(load, stats["moe/router_prob"],
                                                            model_cfg.top_k)),
                  "moe/bias_target": bias_target_from_stat(model_cfg, stat),
                  "moe/load_max_over_mean": jnp.max(jnp.max(load, axis=-1)
                                                    / jnp.mean(load, axis=-1))})
    return (loss_sum / M, stats), grads


def _in_mesh(mesh):
    """The context a step traces under: ``mesh`` (abstract), or none."""
    import jax

    return (jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if mesh is not None
            else contextlib.nullcontext())


def make_train_step(model_cfg: ModelConfig, optimizer, state_shardings, mesh=None,
                    microbatches: int = 1):
    """The jitted ``train_step(state, batch) -> (state, metrics)``, the state donated.
    ``batch``: ``tokens`` and ``targets`` [B, S] and ``lr``, this step's learning rate. Runs
    under ``mesh`` (the MoE layers go expert-parallel), in ``microbatches`` parts."""
    import jax
    import jax.numpy as jnp
    import optax

    import ladder.model as M
    from ladder.model.moe import drop_order, step_tokens
    from ladder.model.transformer import router_weights

    def train_step(state, batch):
        params, rb = state["params"], state["router_bias"]

        def objective(p, tokens, targets, segment_ids):
            return M.loss_fn(model_cfg, p, rb, tokens, targets, segment_ids=segment_ids)

        # the capacity drop order: a new random one every step, the same on every layout
        with _in_mesh(mesh), step_tokens(batch["tokens"].size), drop_order(state["step"]):
            (loss, stats), grads = accumulate(model_cfg, objective, params, batch["tokens"],
                                              batch["targets"], microbatches,
                                              state_shardings["params"], mesh,
                                              batch.get("segment_ids"))
        old_router = router_weights(model_cfg, params)
        with jax.named_scope("optimizer"):   # a profile's split (bench/gpu_rung.py) reads it
            updates, opt_state = optimizer.update(grads, state["opt_state"], params,
                                                  lr=batch["lr"])
            params = optax.apply_updates(params, jax.tree.map(lambda u: -batch["lr"] * u,
                                                              updates))
        new_rb = M.update_router_bias(model_cfg, rb, stats,
                                      router_weights(model_cfg, params) - old_router)
        metrics = {"train/loss": loss, "train/ce": stats["ce"], "train/z_loss": stats["z_loss"],
                   "grad/norm": optax.global_norm(grads), "optim/lr": batch["lr"]}
        metrics.update({k: v for k, v in stats.items() if k.startswith("moe/") and v.ndim == 0})
        for group, leaves in M.param_groups(params).items():
            metrics[f"params/norm/{group}"] = jnp.sqrt(sum(jnp.sum(jnp.square(x))
                                                           for x in leaves))
        metrics["params/norm/router_bias"] = jnp.sqrt(jnp.sum(jnp.square(new_rb)))
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state,
                     "router_bias": new_rb}
        return new_state, metrics

    return jax.jit(train_step, donate_argnums=0, out_shardings=(state_shardings, None))


def make_eval_step(model_cfg: ModelConfig, mesh=None):
    """Held-out CE of one batch as trained (capacity, drops) and dropless (the ragged path);
    the drop fraction. Runs under ``mesh`` like the train step."""
    import jax

    import ladder.model as M

    def eval_step(params, router_bias, batch):
        seg = batch.get("segment_ids")   # packed documents never attend across a boundary
        with _in_mesh(mesh):
            _, s = M.loss_fn(model_cfg, params, router_bias, batch["tokens"], batch["targets"],
                             segment_ids=seg)
            _, sd = M.loss_fn(model_cfg, params, router_bias, batch["tokens"], batch["targets"],
                              dropless=True, segment_ids=seg)
        return {"loss": s["ce"], "dropless": sd["ce"], "drop_frac": s["moe/drop_frac"]}

    return jax.jit(eval_step)

