"""The hero recipe's quantile-balancing rule for the router bias, as pure functions of arrays.

Axis legend (as in ladder/model/config.py): T tokens, E routed experts, K = top_k, N histogram bins.

The rule (Marin's public hero-run tracking issue, quoted in issue 12 of this project): with
biased logits z = s + b, token t's threshold alpha_t is its (K+1)-th largest biased logit, and
expert e's margin on token t is s[t, e] - alpha_t: e would win t's slot iff margin > -b_e. For
every expert to take the share K/E of the tokens, the new bias is minus the upper K/E quantile
of e's margins, centred. Unlike the threshold rule it accounts for the competition between
experts for a token's K slots.

The quantile comes from a histogram, so that it is a *sum* over devices and microbatches: 10,000
bins (the recipe's), uniform in asinh(margin / 1e-3) over |margin| <= 100: above 1e-3 a bin is
~0.25% of the margin wide, below it ~2.4e-6, so one grid serves router logits at their init scale
(~0.02 x sqrt(d)) and late in training alike.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

N_BINS = 10_000          # the recipe's histogram size
SCALE = 1e-3             # asinh knee: bins are uniform in margin below it, in log(margin) above
MAX_MARGIN = 100.0       # the grid covers |margin| <= MAX_MARGIN
_U_MAX = math.asinh(MAX_MARGIN / SCALE)   # the grid is uniform in u = asinh(margin / SCALE)


def rows_mesh(n_rows: int):
    """The abstract mesh in context (``jax.set_mesh``) when it has more than one device and they
    split ``n_rows`` rows evenly, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or mesh.size == 1 or n_rows % mesh.size else mesh


def top_k_rows(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k`` over the last axis of ``x`` [T, E], each device on its own rows: under a
    mesh whose devices split T, inside ``shard_map`` (XLA's SPMD partitioner gathers the whole
    [T, E] operand of a top_k on every device: 4.9 TB of all-gather per step per device on
    27.7B-A1.2B over 64 devices, measured with ``ladder plan --compile``, issue 37)."""
    mesh = rows_mesh(x.shape[0])
    if mesh is None:
        return jax.lax.top_k(x, k)
    rows = P(tuple(mesh.axis_names))
    return jax.shard_map(lambda v: tuple(jax.lax.top_k(v, k)), mesh=mesh, in_specs=rows,
                         out_specs=(rows, rows))(x)


def margins(logits: jax.Array, bias: jax.Array, top_k: int) -> jax.Array:
    """logits [T, E] (unbiased), bias [E] -> margins [T, E]: s[t, e] - alpha_t, alpha_t the
    (top_k + 1)-th largest biased logit of token t."""
    if not 0 < top_k < logits.shape[-1]:
        raise ValueError(f"top_k: the quantile rule needs 0 < top_k < n_experts, got {top_k} "
                         f"of {logits.shape[-1]}")
    s = jax.lax.stop_gradient(logits).astype(jnp.float32)
    biased = s + jax.lax.stop_gradient(bias).astype(jnp.float32)[None, :]
    alpha = top_k_rows(biased, top_k + 1)[0][:, top_k]                 # [T]
    return s - alpha[:, None]


def margin_histogram(logits: jax.Array, bias: jax.Array, top_k: int) -> jax.Array:
    """Counts [E, N_BINS] (float32, exact up to 2^24 per bin) of each expert's margins: the
    summable statistic of the rule. logits [T, E], bias [E]."""
    m = margins(logits, bias, top_k)                                   # [T, E]
    T, E = m.shape
    u = (jnp.arcsinh(m / SCALE) + _U_MAX) / (2 * _U_MAX) * N_BINS     # [T, E] in [0, N)
    b = jnp.clip(jnp.floor(u), 0, N_BINS - 1).astype(jnp.int32)       # [T, E] bin of each
    flat = (jnp.arange(E, dtype=jnp.int32)[None, :] * N_BINS + b).reshape(T * E)
    counts = jnp.zeros((E * N_BINS,), jnp.float32).at[flat].add(1.0)
    return counts.reshape(E, N_BINS)                                   # [E*N] -> [E, N]


def upper_quantile(counts: jax.Array, share: float) -> jax.Array:
    """counts [..., N_BINS] -> [...]: the margin above which ``share`` of the counted margins
    lie, linear within the bin that holds it."""
    counts = counts.astype(jnp.float32)
    total = jnp.sum(counts, axis=-1, keepdims=True)                    # [..., 1]
    want = share * total                                               # margins to lie above
    above = jnp.cumsum(counts[..., ::-1], axis=-1)[..., ::-1]          # [..., N]: >= bin lower edge
    # the bin holding the quantile: the highest bin whose lower edge has >= want above it
    idx = jnp.sum(above >= want, axis=-1, keepdims=True) - 1           # [..., 1]
    idx = jnp.clip(idx, 0, N_BINS - 1)
    above_i = jnp.take_along_axis(above, idx, axis=-1)
    count_i = jnp.take_along_axis(counts, idx, axis=-1)
    # within bin i: (above_i - want) of its count_i margins lie below the quantile
    frac = jnp.where(count_i > 0, (above_i - want) / jnp.maximum(count_i, 1.0), 0.0)
    u = (idx + jnp.clip(frac, 0.0, 1.0)) / N_BINS * (2 * _U_MAX) - _U_MAX
    return (jnp.sinh(u) * SCALE)[..., 0]


def bias_from_histogram(counts: jax.Array, top_k: int) -> jax.Array:
    """Summed margin counts [..., E, N_BINS] -> the new router bias [..., E]: minus each
    expert's upper top_k/E quantile, centred over experts. Counts may be summed or averaged
    over devices and microbatches: the quantile depends only on their proportions."""
    E = counts.shape[-2]
    beta = upper_quantile(counts, top_k / E)                           # [..., E]
    bias = -beta
    return bias - jnp.mean(bias, axis=-1, keepdims=True)

