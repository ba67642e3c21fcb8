"""The optimizers a rung trains with: ``adamw`` (every earlier ladder) and ``marin``, the hero
recipe's three groups (Marin's public hero-run tracking issue; issue 12 of this project):

- **MuonH** on the hidden matrices (attention, latent projections, shared and routed experts,
  GatedNorm's matrices): the recipe's Muon direction (issue 22 item 3; Marin's grug MoE
  ``scale_with_grug_muonh``): momentum m <- 0.95 m + g (undamped, no bias correction), the
  Nesterov input 0.95 m + g, orthogonalised by 5 Newton-Schulz steps (constants in
  ladder/optspec.py), then the hyperball step p' = p - lr * u * |p| / |u|, renormalised to |p|.
  Norms are Frobenius norms *per matrix* (a routed-expert weight [E, L, F] is E matrices). No
  second moment.
- **AdamH** on the LM head: the Adam direction, the same hyperball step, at the MuonH LR.
- **Adam** (no weight decay) on the embedding, the router, the norm gains, the attention head
  gates and the short-convolution kernels. The router *bias* is set by the balancing rule
  (ladder/model/moe.py), not here.

Learning rates, betas and eps follow the recipe's rules (ladder/optspec.py: MuonH LR = 13/3 x the
Adam LR, capped at 0.05; tests/test_optim.py). The step's input ``lr`` is the Adam peak times
the schedule's multiplier, so the multiplier applies to both peaks. The trainer applies
``params - lr * updates``; the hyperball groups need the step's LR to land on the sphere, so
``update(..., lr=...)`` takes it and returns ``(p - p') / lr`` for those leaves (exact up to
float rounding). The plain-Python settings (:class:`OptimizerSpec`, :class:`OptimizerSettings`)
live in :mod:`ladder.optspec`, without JAX.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ladder.optspec import (  # noqa: F401  (MUON_NS_COEFFS, OptimizerSpec re-exported)
    ADAM_GROUPS,
    ADAMH_GROUPS,
    MUON_NS_COEFFS,
    MUON_NS_EPS,
    MUONH_GROUPS,
    NORM_GAIN,
    OptimizerSettings,
    OptimizerSpec,
)

# How far the hidden matrices' init std may sit from the recipe's 0.5/sqrt(d) before the marin
# optimizer warns (issue 12 item 2): MuonH/AdamH keep each matrix at its initial norm for good
# (std 0.02: the cpu ladder's proxy trained to 3.889 against the recipe init's 2.527, issue 37;
# docs/LOG.md, 2026-12-01). A factor of 2 either way flags 0.02 at d=16 (0.16x).
INIT_STD_TOLERANCE = 2.0


def init_warning(kind: str, model_cfg) -> str | None:
    """A one-line warning when ``kind``'s optimizer is known not to train well from
    ``model_cfg``'s init (None: no objection); only ``marin`` objects (INIT_STD_TOLERANCE)."""
    if kind != "marin":
        return None
    from ladder.model.config import RECIPE_INIT_COEF
    want = RECIPE_INIT_COEF / np.sqrt(model_cfg.d_model)
    have = model_cfg.weight_std
    if want / INIT_STD_TOLERANCE <= have <= want * INIT_STD_TOLERANCE:
        return None
    return (f"optimizer marin: the model's init std {have:.4g} is {have / want:.2g}x the recipe's "
            f"0.5/sqrt(d_model) = {want:.4g}; MuonH keeps every matrix at its initial norm, so "
            f"this run trains with that scale for good (the cpu ladder: 3.889 against 2.527). "
            f"Use --model.init=recipe")


def warn_init(kind: str, model_cfg) -> None:
    """:func:`init_warning` as a Python warning (the CLI prints it on stderr)."""
    msg = init_warning(kind, model_cfg)
    if msg is not None:
        import warnings
        warnings.warn(msg, UserWarning, stacklevel=2)


def make_optimizer(settings: OptimizerSettings):
    """The optax transformation for ``settings``; ``update(grads, state, params, lr=...)``
    (``adamw`` ignores ``lr``), so the compiled program never depends on the schedule."""
    import optax

    if settings.kind == "adamw":
        return adamw(settings)
    parts = [optax.clip_by_global_norm(settings.clip)] if settings.clip else []
    parts.append(scale_by_marin(settings))
    if settings.weight_decay:  # not the recipe (it has none); decays the Adam group's matrices
        parts.append(optax.add_decayed_weights(settings.weight_decay,
                                               mask=partial(_matrix_mask, adam_only=True)))
    return optax.chain(*parts)


def adamw(settings: OptimizerSettings):
    """Global-norm clipping, adam scaling, then decoupled weight decay on matrices only."""
    import optax

    parts = [optax.clip_by_global_norm(settings.clip)] if settings.clip else []
    parts += [optax.scale_by_adam(b1=settings.beta1, b2=settings.beta2, eps=settings.eps),
              optax.add_decayed_weights(settings.weight_decay, mask=_matrix_mask)]
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
    """The marin group of the parameter at ``path``, by ``model.transformer.param_group``; the
    leaf name decides only norm gains ("scale": Adam wherever they sit) and an attention
    weight's matrix axes (q/k/v [.., D, heads, Hd]: D -> heads*Hd; o: heads*Hd -> D); other
    hyperball weights are [.., in, out], their leading axes batches of matrices. An unknown
    group is an error: a new kind of parameter never silently gets the wrong optimizer."""
    from optax.contrib import MuonDimensionNumbers as Dims

    from ladder.model.transformer import param_group

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


def _matrix_mask(params, adam_only: bool = False):
    """True on the matrices once the scanned layers' stack axis is set aside (a [G, D] stack of
    norm scales is G vectors: it gets no weight decay); with ``adam_only``, marin's Adam ones."""
    import jax

    from ladder.model.transformer import stacked_axes

    def leaf(path, x):
        names = _path_names(path)
        return x.ndim - stacked_axes(names) >= 2 and (
            not adam_only or marin_group(names, x.shape).kind == "adam")
    return jax.tree_util.tree_map_with_path(leaf, params)


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


def newton_schulz(x, coeffs, eps: float):
    """The orthogonalised direction of each matrix of ``x`` [..., m, n] (leading axes never
    merged, so a device-split expert axis stays split): x / (|x|_F + eps), every singular value
    in [0, 1], through :func:`ns_iterate`."""
    import jax.numpy as jnp

    return ns_iterate(x / (jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True))
                           + eps), coeffs)


def ns_iterate(x, coeffs):
    """The Newton-Schulz steps on each matrix of ``x`` [..., m, n]: per (a, b, c) of ``coeffs``,
    X <- a X + (b A + c A^2) X with A = X X^T, on the wide orientation (X^T when m > n). Each
    step maps a singular value s to a s + b s^3 + c s^5, so x = U S V^T becomes U f(S) V^T."""
    import jax.numpy as jnp

    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = jnp.swapaxes(x, -1, -2)
    for a, b, c in coeffs:
        gram = jnp.einsum("...ik,...jk->...ij", x, x)                   # [.., m, m]
        poly = b * gram + c * jnp.einsum("...ij,...jk->...ik", gram, gram)
        x = a * x + jnp.einsum("...ij,...jk->...ik", poly, x)
    return jnp.swapaxes(x, -1, -2) if tall else x


def muon_orthogonalize(u, dims, coeffs, eps: float):
    """``u`` shaped like its parameter -> its Newton-Schulz direction, one matrix per index of
    the axes that ``dims`` (optax MuonDimensionNumbers) leaves out: the reduction axes form a
    matrix's rows, the output axes its columns."""
    import jax.numpy as jnp

    red = tuple(sorted(a % u.ndim for a in dims.reduction_axis))
    out = tuple(sorted(a % u.ndim for a in dims.output_axis))
    batch = tuple(a for a in range(u.ndim) if a not in red + out)
    perm = batch + red + out
    moved = jnp.transpose(u, perm)                                   # [batch..., red..., out...]
    lead = moved.shape[:len(batch)]
    rows = int(np.prod([u.shape[a] for a in red]))
    cols = int(np.prod([u.shape[a] for a in out]))
    flat = newton_schulz(moved.reshape(lead + (rows, cols)), coeffs, eps)   # [batch..., R, C]
    return jnp.transpose(flat.reshape(moved.shape), np.argsort(perm))


class MarinState(NamedTuple):
    count: Any   # [] int32: steps taken
    mu: Any      # like params: Adam first moment, or MuonH momentum
    nu: Any      # like params, None on MuonH leaves: Adam second moment (MuonH keeps none)


def drops_muonh(groups, tree):
    """``tree`` (like the params) with None on the MuonH leaves: the second-moment tree."""
    import jax

    return jax.tree.map(lambda g, x: None if g.kind == "muonh" else x, groups, tree,
                        is_leaf=lambda x: isinstance(x, Group))


def scale_by_marin(settings: OptimizerSettings):
    """The recipe's three groups as one optax transformation (state: :class:`MarinState`; its
    ``nu`` Nones need ``is_leaf``, step.py ``state_shardings``). A checkpoint with a zero second
    moment on the MuonH leaves too (before issue 22) restores into it: Orbax reads the leaves
    the target has (tests/test_optim.py)."""
    import jax
    import jax.numpy as jnp
    import optax

    b1, b2, eps, ratio = settings.beta1, settings.beta2, settings.eps, settings.muonh_ratio
    momentum, nesterov, coeffs = settings.muon_momentum, settings.nesterov, settings.ns_coeffs

    def init(params):
        groups = marin_groups(params)  # a parameter without a marin group fails here, not mid-step
        return MarinState(count=jnp.zeros([], jnp.int32),
                          mu=jax.tree.map(jnp.zeros_like, params),
                          nu=drops_muonh(groups, jax.tree.map(jnp.zeros_like, params)))

    def update(grads, state, params=None, *, lr=None, **extra):
        del extra
        if params is None or lr is None:
            raise ValueError("marin: update needs params and the step's lr=")
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        groups = marin_groups(params)
        nu_in = jax.tree.map(lambda g, v, p: jnp.zeros((), p.dtype) if v is None else v,
                             groups, state.nu, params,
                             is_leaf=lambda x: x is None or isinstance(x, Group))

        def leaf(group, g, m, v, p):
            if group.kind == "muonh":
                m = momentum * m + g
                u = momentum * m + g if nesterov else m
                direction = muon_orthogonalize(u, group.dims, coeffs, MUON_NS_EPS)
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
        out = jax.tree.map(leaf, groups, grads, state.mu, nu_in, params, is_leaf=is_group)
        treedef = jax.tree.structure(groups, is_leaf=is_group)
        flat = treedef.flatten_up_to(out)
        updates = treedef.unflatten([o[0] for o in flat])
        mu = treedef.unflatten([o[1] for o in flat])
        nu = drops_muonh(groups, treedef.unflatten([o[2] for o in flat]))
        return updates, MarinState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformationExtraArgs(init, update)
