"""The optimizers a rung trains with: ``adamw`` (every earlier ladder) and ``marin``, the hero
recipe's three groups (Marin's public hero-run tracking issue; issue 12 of this project):

- **MuonH** on the hidden matrices (attention, latent projections, shared and routed experts):
  u = Newton-Schulz-5 orthogonalised Nesterov momentum (``optax.contrib.scale_by_muon``), then the
  hyperball step p' = p - lr * u * |p| / |u|, renormalised to |p|. Norms are Frobenius norms
  *per matrix*: a routed-expert weight [E, L, F] is E matrices, each kept at its own norm (and a
  stacked [n_layers, ...] weight is one matrix per layer).
- **AdamH** on the output projection (the LM head): the Adam direction, the same hyperball step,
  at the MuonH learning rate.
- **Adam** (no weight decay) on the embedding, the router, the norm gains, the attention head
  gates and the short-convolution kernels (GatedNorm's matrices are MuonH's). The
  router *bias* is not a parameter here: the balancing rule sets it (model/moe.py).

Learning rates: Adam LR = the ladder's rule (0.087571 x tokens^-0.3461 x d^-0.3448 x
sqrt(tokens per batch), ``ladder.specs.Recipe.peak_lr``); MuonH LR = 13/3 x Adam LR, capped at
0.05. beta2 = clip(0.999^(tokens per batch / 131072), 0.95, 0.9999); eps = 9.676e-18 x
sqrt(tokens / tokens per batch); beta1 0.9; no clipping, no weight decay. With these the
published peak LRs come out to < 1% (tests/test_optim.py). beta1 also serves as MuonH's
momentum (the recipe names one beta1; optax's Muon default would be 0.95).

The schedule: the step's input ``lr`` is the Adam peak times the schedule's multiplier
(``ladder.train.lr_table``), so the MuonH/AdamH step is ``lr x muonh_lr / adam_lr``: the
multiplier applies to both peaks. The trainer applies ``params - lr * updates``; the hyperball
groups need the step's LR to land on the sphere, so ``update(..., lr=...)`` takes it and returns
``(p - p') / lr`` for those leaves (exact up to float rounding: |p| is kept to ~1e-7).

The hyperball keeps every MuonH/AdamH matrix at its initial norm for the whole run, so the init
scale is a hyperparameter for good: the recipe's init (std 0.5/sqrt(d), issue 12 item 2) is part
of it. With today's std 0.02 the small ladders' LM heads stay too small (tiny ladder, 60 steps:
train CE 4.8 under marin against 2.5 under AdamW; with std 0.5/sqrt(d) = 0.125, 2.8 and 2.6).

The plain-Python part (:class:`OptimizerSpec`, :class:`OptimizerSettings`) has no JAX: ``ladder
list`` prints the settings. :func:`make_optimizer` imports optax when called.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

OPTIMIZERS = ("adamw", "marin")

# AdamW defaults (the optimizer of every ladder before issue 12; the usual LLM choices: GPT-3,
# Llama): b2 0.95, eps 1e-8, decoupled weight decay 0.1 on matrices, global-norm clip 1.0.
ADAMW_DEFAULTS = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0}

# The hero recipe's rules (Marin's public hero-run tracking issue, quoted in issue 12).
MUONH_LR_RATIO = 13 / 3          # MuonH LR = 13/3 x Adam LR ...
MUONH_LR_CAP = 0.05              # ... at most 0.05
BETA2_BASE, BETA2_BATCH_TOKENS = 0.999, 131_072   # beta2 = 0.999^(tokens per batch / 131072)
BETA2_MIN, BETA2_MAX = 0.95, 0.9999               # ... clipped to [0.95, 0.9999]
EPS_COEF = 9.676e-18             # eps = 9.676e-18 x sqrt(tokens / tokens per batch)
MARIN_BETA1 = 0.9

# Group of each parameter under ``marin``, by the group names of model.transformer.param_group.
# The recipe's "gates and norm gains" get plain Adam: the convolution kernels and head gates
# (zero-initialised: a hyperball step keeps a matrix at its norm, and 0 would stay 0); GatedNorm's
# W_down/W_up are hidden matrices: MuonH.
ADAM_GROUPS = ("embedding", "router", "norms", "convs", "head_gates")
ADAMH_GROUPS = ("lm_head",)
MUONH_GROUPS = ("attention", "latent", "shared_experts", "routed_experts", "gated_norms")
NORM_GAIN = "scale"              # leaf name of every RMSNorm gain (model/layers.py): Adam


@dataclass(frozen=True)
class OptimizerSettings:
    """The resolved optimizer of one rung: what `ladder list --json` shows under "optimizer".
    ``muonh_lr`` is None for ``adamw``."""

    kind: str
    adam_lr: float
    muonh_lr: float | None
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    clip: float

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"kind: must be one of {OPTIMIZERS}, got {self.kind!r}")
        if not self.adam_lr > 0:
            raise ValueError(f"adam_lr: must be > 0, got {self.adam_lr!r}")
        if self.kind == "marin" and not (self.muonh_lr or 0) > 0:
            raise ValueError(f"muonh_lr: must be > 0 for marin, got {self.muonh_lr!r}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name}: must be in [0, 1), got {getattr(self, name)!r}")
        for name in ("eps", "weight_decay", "clip"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")

    @property
    def muonh_ratio(self) -> float:
        """MuonH/AdamH step per unit of the step's (Adam) LR."""
        return (self.muonh_lr or 0.0) / self.adam_lr

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OptimizerSpec:
    """A rung's optimizer rule: the kind, and fixed values that override the kind's rules
    (None = the rule). Lives in the ladder's recipe (ladder files) and in each rung."""

    kind: str = "adamw"
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    clip: float | None = None

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"kind: must be one of {OPTIMIZERS}, got {self.kind!r}")
        for name in ("beta1", "beta2", "eps", "weight_decay", "clip"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{name}: must be null or a number, got {v!r}")
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if v is not None and not 0 <= v < 1:
                raise ValueError(f"{name}: must be in [0, 1), got {v!r}")
        for name in ("eps", "weight_decay", "clip"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ValueError(f"{name}: must be >= 0, got {v!r}")

    def settings(self, adam_lr: float, tokens: float, tokens_per_step: int) -> OptimizerSettings:
        """The numbers for a run of ``tokens`` tokens at ``tokens_per_step`` per step whose Adam
        peak LR is ``adam_lr``."""
        if self.kind == "adamw":
            rule = dict(ADAMW_DEFAULTS, muonh_lr=None)
        else:
            beta2 = BETA2_BASE ** (tokens_per_step / BETA2_BATCH_TOKENS)
            rule = {"muonh_lr": min(MUONH_LR_RATIO * adam_lr, MUONH_LR_CAP),
                    "beta1": MARIN_BETA1, "beta2": min(max(beta2, BETA2_MIN), BETA2_MAX),
                    "eps": EPS_COEF * math.sqrt(tokens / tokens_per_step),
                    "weight_decay": 0.0, "clip": 0.0}
        fixed = {k: float(getattr(self, k)) for k in ("beta1", "beta2", "eps", "weight_decay",
                                                      "clip") if getattr(self, k) is not None}
        return OptimizerSettings(kind=self.kind, adam_lr=float(adam_lr), **{**rule, **fixed})

    def replace(self, **kw) -> "OptimizerSpec":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "OptimizerSpec":
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown optimizer key")
        return cls(**d)


# ------------------------------------------------------------------------------ optax part


def make_optimizer(settings: OptimizerSettings):
    """The optax transformation for ``settings``. Its ``update(grads, state, params, lr=...)``
    returns updates that the trainer applies as ``params - lr * updates`` (``adamw`` ignores
    ``lr``; ``marin`` needs it for the hyperball step). The compiled program depends on the
    settings only through their numbers' ratios and betas, never on the schedule."""
    import optax

    if settings.kind == "adamw":
        return adamw(settings)
    parts = [optax.clip_by_global_norm(settings.clip)] if settings.clip else []
    parts.append(scale_by_marin(settings))
    if settings.weight_decay:  # not the recipe (it has none); decays the Adam group's matrices
        parts.append(optax.add_decayed_weights(settings.weight_decay, mask=_adam_matrix_mask))
    return optax.chain(*parts)


def adamw(settings: OptimizerSettings):
    """AdamW as optax composes it (adam scaling, then decoupled weight decay on matrices only:
    norm scales and other vectors are not decayed), after global-norm clipping."""
    import jax
    import optax

    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, x: _is_matrix(_path_names(path), x), params)

    parts = [optax.clip_by_global_norm(settings.clip)] if settings.clip else []
    parts += [optax.scale_by_adam(b1=settings.beta1, b2=settings.beta2, eps=settings.eps),
              optax.add_decayed_weights(settings.weight_decay, mask=decay_mask)]
    return optax.chain(*parts)


class Group(NamedTuple):
    """How ``marin`` treats one parameter: "adam", "adamh" or "muonh"; for the hyperball groups
    the axes that form each matrix (``dims``, an optax MuonDimensionNumbers: every other axis,
    e.g. the expert axis, is a batch of separate matrices)."""

    kind: str
    dims: Any = None


def _path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def marin_group(path: tuple[str, ...], shape: tuple[int, ...]) -> Group:
    """The marin group of the parameter at ``path`` (names as in the params dict).

    Written against the group names of ``model.transformer.param_group``; the leaf name decides
    only (a) norm gains ("scale") -> Adam wherever they sit, and (b) which axes of an attention
    weight form its matrix: q/k/v [.., D, heads, Hd] map D -> heads*Hd, o [.., heads, Hd, D] maps
    heads*Hd -> D. Every other hyperball weight is [.., in, out]. Leading axes (experts, shared
    experts, stacked layers) are batches of matrices. An unknown group is an error, so a new
    kind of parameter cannot silently get the wrong optimizer."""
    from optax.contrib import MuonDimensionNumbers as Dims

    from model.transformer import param_group

    group = param_group(path)
    leaf = path[-1]
    if group in ADAM_GROUPS or leaf == NORM_GAIN:
        return Group("adam")
    if group not in ADAMH_GROUPS + MUONH_GROUPS:
        raise ValueError(f"{'/'.join(path)}: parameter group {group!r} has no marin optimizer "
                         f"group (known: {ADAM_GROUPS + ADAMH_GROUPS + MUONH_GROUPS})")
    kind = "adamh" if group in ADAMH_GROUPS else "muonh"
    if group == "attention" and leaf in ("q", "k", "v"):
        dims = Dims(reduction_axis=(-3,), output_axis=(-2, -1))
    elif group == "attention" and leaf == "o":
        dims = Dims(reduction_axis=(-3, -2), output_axis=(-1,))
    else:
        dims = Dims(reduction_axis=(-2,), output_axis=(-1,))
    need = max(len(dims.reduction_axis) + len(dims.output_axis), 2)
    if len(shape) < need:
        raise ValueError(f"{'/'.join(path)}: a {kind} weight needs rank >= {need}, got shape "
                         f"{tuple(shape)}")
    return Group(kind, dims)


def marin_groups(params) -> Any:
    """Tree of :class:`Group` like ``params`` (leaves are Group tuples)."""
    import jax

    return jax.tree_util.tree_map_with_path(
        lambda path, x: marin_group(_path_names(path), x.shape), params)


def _adam_matrix_mask(params):
    import jax

    return jax.tree_util.tree_map_with_path(
        lambda path, x: _is_matrix(_path_names(path), x)
        and marin_group(_path_names(path), x.shape).kind == "adam", params)


def _is_matrix(names: tuple[str, ...], x) -> bool:
    """A matrix once the scanned layers' stack axis is set aside (a [G, D] stack of norm scales
    is G vectors, not a matrix: it gets no weight decay)."""
    from model.transformer import stacked_axes

    return x.ndim - stacked_axes(names) >= 2


def _matrix_axes(x, dims) -> tuple[int, ...]:
    return tuple(sorted(a % x.ndim for a in (*dims.reduction_axis, *dims.output_axis)))


def hyperball_step(p, u, step_lr, axes):
    """p' = (p - step_lr * u * |p| / |u|) * |p| / |that|, norms over ``axes`` (one matrix each).
    Returns p' - p. A zero direction leaves p unchanged."""
    import jax.numpy as jnp

    def norm(x):
        return jnp.sqrt(jnp.sum(jnp.square(x), axis=axes, keepdims=True))

    tiny = jnp.finfo(p.dtype).tiny
    p_norm = norm(p)
    moved = p - (step_lr * p_norm / jnp.maximum(norm(u), tiny)) * u
    return moved * (p_norm / jnp.maximum(norm(moved), tiny)) - p


class MarinState(NamedTuple):
    count: Any   # [] int32: steps taken
    mu: Any      # like params: Adam first moment, or MuonH momentum
    nu: Any      # like params: Adam second moment (zeros, unused, on MuonH leaves: see below)


def scale_by_marin(settings: OptimizerSettings):
    """The recipe's three groups as one optax transformation.

    The state holds two trees shaped like the params, so ``optax.tree_utils.tree_map_params``
    and the trainer's shardings see every moment. MuonH leaves carry an unused zero second
    moment: a tree with holes would break both, and Orbax refuses zero-size stand-ins. It costs
    what AdamW's state costs (ladder/plan.py assumes 2 x params of optimizer state)."""
    import jax
    import jax.numpy as jnp
    import optax
    from optax.contrib import MuonState, scale_by_muon

    b1, b2, eps, ratio = settings.beta1, settings.beta2, settings.eps, settings.muonh_ratio

    def init(params):
        marin_groups(params)  # a parameter without a marin group fails here, not mid-step
        return MarinState(count=jnp.zeros([], jnp.int32),
                          mu=jax.tree.map(jnp.zeros_like, params),
                          nu=jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params=None, *, lr=None, **extra):
        del extra
        if params is None or lr is None:
            raise ValueError("marin: update needs params and the step's lr=")
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        groups = marin_groups(params)

        def leaf(group, g, m, v, p):
            if group.kind == "muonh":
                # optax's Muon: Nesterov momentum, then Newton-Schulz-5 per matrix (vmapped over
                # the batch axes named by dims); its count is ours (same steps taken).
                muon = scale_by_muon(beta=b1, weight_dimension_numbers=group.dims)
                ns = muon.init(g).ns_coeffs
                u, s = muon.update(g, MuonState(count=state.count, mu=m, ns_coeffs=ns))
                m, direction = s.mu, u
            else:
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * jnp.square(g)
                m_hat = m / (1 - b1 ** t)
                v_hat = v / (1 - b2 ** t)
                direction = m_hat / (jnp.sqrt(v_hat) + eps)
            if group.kind == "adam":
                return direction, m, v
            delta = hyperball_step(p, direction, lr * ratio, _matrix_axes(p, group.dims))
            # the trainer applies p - lr * update: hand it -delta / lr (nothing moves at lr 0)
            safe = jnp.where(lr > 0, lr, 1.0)
            return jnp.where(lr > 0, -delta / safe, jnp.zeros_like(delta)), m, v

        is_group = lambda x: isinstance(x, Group)  # noqa: E731
        out = jax.tree.map(leaf, groups, grads, state.mu, state.nu, params, is_leaf=is_group)
        treedef = jax.tree.structure(groups, is_leaf=is_group)
        flat = treedef.flatten_up_to(out)
        updates = treedef.unflatten([o[0] for o in flat])
        mu = treedef.unflatten([o[1] for o in flat])
        nu = treedef.unflatten([o[2] for o in flat])
        return updates, MarinState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformationExtraArgs(init, update)
