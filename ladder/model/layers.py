"""Dense building blocks: RMSNorm, partial RoPE, causal attention with QK-norm and grouped KV heads.

Axis legend (as in ladder/model/config.py): B batch, S sequence (query positions), T sequence (key
positions, or flattened tokens B*S in model/moe.py), D model width, H query heads, K KV heads,
G query heads per KV head (H = K * G), Hd head dim.
Einsum letters: b=B, s=S, t=T, d=D, h=H, k=K, g=G, x=Hd.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct
from flax.core import meta, unfreeze
from flax.traverse_util import flatten_dict, unflatten_dict

from ladder.model.config import ModelConfig


# ------------------------------------------------------------------------------------ init
@struct.dataclass
class Init(meta.AxisMetadata):
    """A parameter boxed with how it was initialised: normal(0, std) (truncated at +-truncate
    sigmas when set), or the constant ``fill`` when std is None. The box survives
    ``jax.eval_shape`` (std is static), so ``model.init`` reads every parameter's shape and rule
    from one abstract trace and draws the values with numpy (XLA took ~17 s to jit the linen
    init of the largest cpu-ladder rung)."""

    value: Any
    std: float | None = struct.field(pytree_node=False)
    truncate: float | None = struct.field(pytree_node=False, default=None)
    fill: float = struct.field(pytree_node=False, default=1.0)

    # flax's AxisMetadata protocol (all four abstract): linen unboxes a parameter it reads
    def unbox(self):
        return self.value

    def replace_boxed(self, val):
        return self.replace(value=val)

    def add_axis(self, index, params):
        return self

    def remove_axis(self, index, params):
        return self


def normal(std: float, truncate: float | None = None):
    """Linen initializer: normal(0, std), truncated at +-``truncate`` sigmas when given (redrawn:
    sigma is the untruncated normal's, the sample's std 0.987 sigma at +-3), boxed."""
    def init(key, shape, dtype=jnp.float32):
        if truncate is None:
            z = jax.random.normal(key, shape, dtype)
        else:
            z = jax.random.truncated_normal(key, -truncate, truncate, shape, dtype)
        return Init(std * z, std, truncate)
    return init


def ones(key, shape, dtype=jnp.float32):
    """Linen initializer for norm scales: ones, boxed."""
    return Init(jnp.ones(shape, dtype), None)


def zeros(key, shape, dtype=jnp.float32):
    """Linen initializer of the recipe's gates and convolution kernels: zeros, boxed (the head
    gate and the residual convolutions start as the identity)."""
    return Init(jnp.zeros(shape, dtype), None, None, 0.0)


def weight_init(cfg: ModelConfig):
    """Init of every weight matrix (``cfg.init``: ``cfg.weight_std``, ``cfg.init_truncate``)."""
    return normal(cfg.weight_std, cfg.init_truncate)


def param_rng(seed: int, path: tuple[str, ...]) -> np.random.Generator:
    """The numpy stream a parameter is drawn from: seeded by (seed, crc32 of its path)."""
    return np.random.default_rng([seed, zlib.crc32("/".join(path).encode())])


def draw_normal_regions(seed: int, path: tuple[str, ...], shape: tuple, std: float,
                        truncate: float | None, regions: list[tuple],
                        chunk: int = 1 << 22) -> list[np.ndarray]:
    """A parameter's initial values in each region (a tuple of (start, stop) per axis): ``std``
    x standard normals of its stream in C order; with ``truncate``, values beyond +-truncate
    are redrawn from the same stream (all of them in C order, again until none is left). The
    stream goes in blocks of ~``chunk`` values along the first axis, only the regions kept
    (numpy's generators give the same values drawn at once or in pieces); truncation's redraws
    need every out-of-range position, so then it is read to its end."""
    if not shape:                                  # a scalar: one value, drawn as [1]
        return [v.reshape(()) for v in draw_normal_regions(seed, path, (1,), std, truncate,
                                                           [((0, 1),)] * len(regions), chunk)]
    rng = param_rng(seed, path)
    outs = [np.empty([b - a for a, b in r], np.float32) for r in regions]
    row = int(np.prod(shape[1:], dtype=np.int64))
    rows = max(1, chunk // max(row, 1))
    last = shape[0] if truncate is not None else max((r[0][1] for r in regions), default=0)
    bad = []
    for r0 in range(0, last, rows):
        r1 = min(last, r0 + rows)
        z = rng.standard_normal((r1 - r0, *shape[1:]), dtype=np.float32)
        if truncate is not None:
            bad.append(np.flatnonzero(np.abs(z) > truncate) + r0 * row)
        for out, r in zip(outs, regions):
            a, b = max(r[0][0], r0), min(r[0][1], r1)
            if a < b:
                out[a - r[0][0]:b - r[0][0]] = z[(slice(a - r0, b - r0),
                                                  *(slice(lo, hi) for lo, hi in r[1:]))]
    pending = np.concatenate(bad) if bad else np.zeros(0, np.int64)
    while len(pending):                            # the redraws, in C order of the positions
        v = rng.standard_normal(len(pending), dtype=np.float32)
        ok = ~(np.abs(v) > truncate)
        coords = np.unravel_index(pending[ok], shape)
        for out, r in zip(outs, regions):
            inside = np.logical_and.reduce([(c >= lo) & (c < hi) for c, (lo, hi) in
                                            zip(coords, r)])
            out[tuple(c[inside] - lo for c, (lo, _) in zip(coords, r))] = v[ok][inside]
        pending = pending[~ok]
    return [std * out for out in outs]


def _host_values(box: Init, seed: int, path: tuple[str, ...], shape: tuple, regions: list,
                 slices) -> list[np.ndarray]:
    """One parameter's initial values in each region (a tuple of (start, stop) per axis)."""
    if box.std is None:
        return [np.full([b - a for a, b in r], box.fill, np.float32) for r in regions]
    parts = slices(path) if slices is not None else None
    if parts is None:
        return draw_normal_regions(seed, path, shape, box.std, box.truncate, regions)
    host = [np.empty([b - a for a, b in r], np.float32) for r in regions]
    for g, p in enumerate(parts):                       # [G, ...]: slice g drawn as parts[g]
        want = [k for k, r in enumerate(regions) if r[0][0] <= g < r[0][1]]
        got = draw_normal_regions(seed, p, shape[1:], box.std, box.truncate,
                                  [regions[k][1:] for k in want])
        for k, v in zip(want, got):
            host[k][g - regions[k][0][0]] = v
    return host


def materialize(boxes, seed: int, slices=None) -> dict:
    """Nested dict of Init(ShapeDtypeStruct, std) (``jax.eval_shape`` of a linen init) -> nested
    dict of arrays, each drawn from its own numpy stream (:func:`param_rng`), so its value does
    not depend on which other parameters exist. ``slices(path)``: for a parameter stacked on a
    leading axis (the scanned layers), the path each slice is drawn under (None: not stacked)."""
    values = {}
    for path, box in flatten_dict(unfreeze(boxes)).items():
        shape = tuple(box.value.shape)
        whole = tuple((0, n) for n in shape)
        values[path] = jnp.asarray(_host_values(box, seed, path, shape, [whole], slices)[0],
                                   box.value.dtype)
    return unflatten_dict(values)


def materialize_sharded(boxes, seed: int, shardings, slices=None) -> dict:
    """:func:`materialize`'s values, placed with ``shardings`` (a params-shaped nested dict of
    ``jax.sharding.Sharding``), each process drawing only the regions of its own devices
    (:func:`draw_normal_regions`): host memory holds one parameter's local shards at a time."""
    flat_shardings = flatten_dict(unfreeze(shardings))
    values = {}
    for path, box in flatten_dict(unfreeze(boxes)).items():
        shape, dtype = tuple(box.value.shape), box.value.dtype
        sharding = flat_shardings[path]
        index = {d: tuple(sl.indices(n)[:2] for sl, n in zip(idx, shape))
                 for d, idx in sharding.addressable_devices_indices_map(shape).items()}
        regions = sorted(set(index.values()))         # replicas share one region
        host = [h.astype(dtype, copy=False)
                for h in _host_values(box, seed, path, shape, regions, slices)]
        where = {r: k for k, r in enumerate(regions)}
        values[path] = jax.make_array_from_single_device_arrays(
            shape, sharding, [jax.device_put(host[where[r]], d) for d, r in index.items()])
        del host
    return unflatten_dict(values)


# The recipe's non-parametric QK-norm eps; its residual-stream norms use layer_norm_eps = 1e-5,
# ``ModelConfig.norm_eps`` (Marin's grug MoE, marin-community/marin
# experiments/grug/moe/model.py: `rms_norm(q)` with its default eps=1e-6).
QK_RMS_EPS = 1e-6


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """x / rms(x) * scale over the last axis, computed in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale).astype(x.dtype)


class RMSNorm(nn.Module):
    eps: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", ones, (x.shape[-1],), jnp.float32)
        return rms_norm(x, scale, self.eps)


def rope(x: jax.Array, positions: jax.Array, rope_dim: int, theta: float) -> jax.Array:
    """Rotary position embedding on the first ``rope_dim`` channels of each head: x [B, S, N, Hd]
    (N heads), positions [S]. Channel i pairs with channel i + rope_dim/2 ("rotate-half")."""
    if rope_dim == 0:
        return x
    half = rope_dim // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)  # [half]: theta^(-2i/rope_dim)
    angle = positions.astype(jnp.float32)[:, None] * freq[None, :]   # [S, half]
    cos = jnp.cos(angle)[None, :, None, :]                           # [1, S, 1, half]
    sin = jnp.sin(angle)[None, :, None, :]
    x1, x2, rest = x[..., :half], x[..., half:rope_dim], x[..., rope_dim:]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return jnp.concatenate([rotated.astype(x.dtype), rest], axis=-1)


# cuDNN's packed layout (per-row segment offsets and lengths, each document causal and windowed
# within itself) reaches jax 0.10 only through its internal module (openxla/xla#20861,
# jax-ml/jax#25812; jax-ml/jax#29731 proposes public arguments); Hopper or later. Its softmax
# statistics are [B * M, H, S] float32 for at most M documents per row (more: the blocked XLA
# path, at run time). M = 32: 50 MB per layer at 1.6B-A61M, a tenth of the [B, 1, S, S] bias
# they replace, documents of ~128 tokens on average in a 4096-token row.
MAX_SEGMENTS = 32
_LOG = logging.getLogger(__name__)
_SAID: set = set()
_TRACED: list = []   # every choice traced in this process, in order (attention_traced)


@dataclass(frozen=True)
class AttentionChoice:
    """Which attention runs and why: ``implementation`` is "cudnn-packed" (cuDNN flash attention,
    documents as packed segments), "cudnn" (flash, no segments), "xla-blocked" (XLA softmax over
    blocks of ``chunk`` queries, :func:`attend_chunked`) or "xla" (one block: S <= chunk)."""

    implementation: str
    reason: str

    def to_dict(self) -> dict:
        return {"implementation": self.implementation, "reason": self.reason}


def cudnn_packed_unavailable() -> str | None:
    """Why cuDNN's packed layout cannot run here (None: it can), by jax's own checks."""
    if jax.default_backend() != "gpu":
        return f"backend is {jax.default_backend()}, not gpu"
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
        fa.check_cudnn_version()
        if not fa.check_compute_capability("9.0"):
            return "cuDNN's packed layout needs a Hopper or later GPU"
    except Exception as e:  # noqa: BLE001  (an internal module: any failure means "not here")
        return f"cuDNN fused attention unavailable: {type(e).__name__}: {e}"
    return None


def attention_choice(dtype, head_dim: int, seq_len: int, segmented: bool,
                     chunk: int | None) -> AttentionChoice:
    """The attention implementation for these shapes on this backend (pure: no logging): cuDNN
    on GPU for bf16/fp16 and head dim a multiple of 8 up to 128 (jax's cuDNN limits), with
    segments only where the packed layout runs; else XLA."""
    flash_ok = (jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0
                and head_dim <= 128)
    blocked = chunk is not None and seq_len > chunk
    xla = "xla-blocked" if blocked else "xla"
    if jax.default_backend() != "gpu":
        return AttentionChoice(xla, f"backend {jax.default_backend()}: XLA attention"
                               + (f" over blocks of {chunk} queries" if blocked else ""))
    if not flash_ok:
        return AttentionChoice(xla, f"cuDNN flash attention takes bf16/fp16 and head dim a "
                               f"multiple of 8 up to 128, not {jnp.dtype(dtype).name} x {head_dim}")
    if not segmented:
        return AttentionChoice("cudnn", "cuDNN flash attention (no segments)")
    why = cudnn_packed_unavailable()
    if why is not None:
        return AttentionChoice(xla, why)
    return AttentionChoice("cudnn-packed", "cuDNN flash attention, documents as packed segments")


def say_attention_choice(choice: AttentionChoice) -> None:
    """Log each distinct choice once per process (a GPU falling back: a warning); record every
    call for :func:`attention_traced`."""
    _TRACED.append(choice)
    if choice in _SAID:
        return
    _SAID.add(choice)
    fallback = jax.default_backend() == "gpu" and not choice.implementation.startswith("cudnn")
    _LOG.log(logging.WARNING if fallback else logging.INFO, "attention: %s (%s)",
             choice.implementation, choice.reason)


def attention_mark() -> int:
    """How many attention calls this process has traced (for :func:`attention_traced`)."""
    return len(_TRACED)


def attention_traced(since: int = 0) -> list[dict]:
    """The distinct attention choices traced since ``since`` (:func:`attention_mark`): what one
    program chose, for env.json."""
    return [c.to_dict() for c in sorted(set(_TRACED[since:]),
                                        key=lambda c: (c.implementation, c.reason))]


class Packed(NamedTuple):
    """Documents of each row in cuDNN's packed layout (jax's ``fused_attention_stablehlo``):
    ``offsets`` [B, M + 1] each segment's start and ``lengths`` [B, M] its length, -1 past the
    row's last; ``count`` [B] segments per row (count > M does not fit)."""
    offsets: jax.Array
    lengths: jax.Array
    count: jax.Array


def packed_segments(segment_ids: jax.Array, max_segments: int) -> Packed:
    """segment_ids [B, S] -> :class:`Packed` with room for ``max_segments`` (M) segments per row.
    A segment is a maximal run of equal ids (packed documents: ids never return), so
    [0, 0, 1, 1, 0] has three. O(B x (S + M)) integers, no [S, S] array."""
    B, S = segment_ids.shape
    M = max_segments
    pos = jnp.arange(S, dtype=jnp.int32)
    start = jnp.concatenate([jnp.ones((B, 1), bool),
                             segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)    # [B, S]
    run = jnp.cumsum(start, axis=1, dtype=jnp.int32) - 1                          # [B, S]
    count = run[:, -1] + 1                                                        # [B]
    rows = jnp.arange(B, dtype=jnp.int32)[:, None]
    # each run's first position (non-starts, and runs past slot M, go out of range: dropped)
    first = jnp.full((B, M + 1), S, jnp.int32).at[rows, jnp.where(start, run, M + 1)].min(
        jnp.broadcast_to(pos, (B, S)), mode="drop")                               # [B, M + 1]
    j = jnp.arange(M + 1, dtype=jnp.int32)[None, :]
    offsets = jnp.where(j < jnp.minimum(count, M)[:, None], first, -1)            # [B, M + 1]
    nxt = jnp.where(j[:, 1:] < count[:, None], first[:, 1:], S)                   # [B, M]
    lengths = jnp.where(j[:, :-1] < count[:, None], nxt - first[:, :-1], -1)      # [B, M]
    return Packed(offsets, lengths, count)


def attend_cudnn_packed(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
                        packed: Packed) -> jax.Array:
    """cuDNN flash attention over packed documents: each segment causal (and windowed) within
    itself, GQA by the kernel. Shapes as in :func:`attend`."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    return fa.dot_product_attention(
        q, k, v, None, None, packed.lengths, packed.lengths, packed.offsets, packed.offsets,
        scale=1.0 / math.sqrt(q.shape[-1]), mask_type=fa.MaskType.PADDING_CAUSAL,
        sliding_window_length=window)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
           segment_ids: jax.Array | None = None, chunk: int | None = None,
           max_segments: int = MAX_SEGMENTS) -> jax.Array:
    """Causal attention: q [B, S, H, Hd], k and v [B, T, K, Hd] with H a multiple of K (head h
    reads KV head h // (H / K)) -> [B, S, H, Hd]. ``window``: each query sees the last
    ``window`` keys, itself included (None: all earlier keys). ``segment_ids`` [B, S] int32: a
    query reads keys of its own segment only (None: one segment). Softmax in float32. The
    implementation is :func:`attention_choice`'s; a batch with more than ``max_segments``
    documents in a row takes the blocked path at run time."""
    choice = attention_choice(q.dtype, q.shape[-1], q.shape[1], segment_ids is not None, chunk)
    say_attention_choice(choice)
    # jax's window (left, right) lets query s read keys s - left ... s + right
    local = None if window is None else (window - 1, 0)
    if choice.implementation == "cudnn":
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local,
                                            implementation="cudnn")
    if choice.implementation == "cudnn-packed":
        packed = packed_segments(segment_ids, max_segments)
        return jax.lax.cond(
            jnp.any(packed.count > max_segments),
            lambda: attend_chunked(q, k, v, window, segment_ids, chunk or q.shape[1]),
            lambda: attend_cudnn_packed(q, k, v, window, packed))
    if choice.implementation == "xla-blocked":
        return attend_chunked(q, k, v, window, segment_ids, chunk)
    # [B, 1, S, T]: query s may read key t only within its own segment
    mask = None if segment_ids is None else (segment_ids[:, :, None]
                                             == segment_ids[:, None, :])[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                        local_window_size=local, implementation="xla")


def attend_chunked(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
                   segment_ids: jax.Array | None, chunk: int) -> jax.Array:
    """:func:`attend` over blocks of ``chunk`` queries (XLA path), under jax.checkpoint: at most
    one block's [B, H, chunk, span] float32 scores exist, forward or backward. A global layer's
    block reads all S keys; a local layer's the ``window - 1`` keys before it and itself (span
    = window - 1 + chunk: O(S x (window + chunk)), not O(S^2)). S is padded to whole blocks."""
    B, S, H, Hd = q.shape
    n = -(-S // chunk)
    pad = n * chunk - S
    dtype = q.dtype
    front = 0 if window is None else window - 1        # keys before the first block
    span = S if window is None else front + chunk
    # keys/values in float32 (K heads: small): their gradient sums over blocks in float32
    kp = jnp.pad(k.astype(jnp.float32), ((0, 0), (front, pad), (0, 0), (0, 0)))
    vp = jnp.pad(v.astype(jnp.float32), ((0, 0), (front, pad), (0, 0), (0, 0)))
    qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    if segment_ids is not None:
        seg_q = jnp.pad(segment_ids, ((0, 0), (0, pad)), constant_values=-1)
        seg_k = jnp.pad(segment_ids, ((0, 0), (front, pad)), constant_values=-1)

    @jax.checkpoint
    def block(i):
        start = i * chunk
        qb = jax.lax.dynamic_slice_in_dim(qp, start, chunk, axis=1)        # [B, c, H, Hd]
        # global: keys 0..S-1 (the slice start is 0); local: keys start - front ... start + c - 1
        kstart = start if window is not None else 0
        kb = jax.lax.dynamic_slice_in_dim(kp, kstart, span, axis=1).astype(dtype)  # [B, span,
        vb = jax.lax.dynamic_slice_in_dim(vp, kstart, span, axis=1).astype(dtype)  #  K, Hd]
        qpos = start + jnp.arange(chunk)                                  # [c] absolute
        kpos = kstart - front + jnp.arange(span)                          # [span] absolute
        mask = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] >= 0)   # [c, span]
        if window is not None:
            mask = mask & (qpos[:, None] - kpos[None, :] < window)
        mask = mask[None, None]                                           # [1, 1, c, span]
        if segment_ids is not None:
            sq = jax.lax.dynamic_slice_in_dim(seg_q, start, chunk, axis=1)   # [B, c]
            sk = jax.lax.dynamic_slice_in_dim(seg_k, kstart, span, axis=1)   # [B, span]
            mask = mask & (sq[:, :, None] == sk[:, None, :])[:, None]       # [B, 1, c, span]
        return jax.nn.dot_product_attention(qb, kb, vb, mask=mask, implementation="xla")

    out = jax.lax.map(block, jnp.arange(n))                               # [n, B, c, H, Hd]
    out = jnp.moveaxis(out, 0, 1).reshape(B, n * chunk, H, Hd)            # -> [B, n*c, H, Hd]
    return out[:, :S]


def output_init(cfg: ModelConfig):
    """Init of projections that write into the residual stream (``cfg.residual_std``)."""
    return normal(cfg.residual_std, cfg.init_truncate)


class GatedRMSNorm(nn.Module):
    """A residual-stream RMSNorm with a learned gain ("scale"), then, when ``cfg.gated_rank`` > 0,
    GatedNorm (:func:`gated_norm`, W_down [D, r], W_up [r, D], r = ``cfg.gated_rank``)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        D = x.shape[-1]
        scale = self.param("scale", ones, (D,), jnp.float32)
        y = rms_norm(x, scale, cfg.norm_eps)
        r = cfg.gated_rank
        if not r:
            return y
        w_down = self.param("gate_down", weight_init(cfg), (D, r), jnp.float32)
        w_up = self.param("gate_up", weight_init(cfg), (r, D), jnp.float32)
        return gated_norm(y, w_down, w_up)


def gated_norm(y: jax.Array, w_down: jax.Array, w_up: jax.Array) -> jax.Array:
    """GatedNorm's gate on an already normalised y [..., D]: y * sigmoid(silu(y W_down) W_up),
    in the compute dtype, the sigmoid in float32."""
    h = jax.nn.silu(jnp.einsum("...d,dr->...r", y, w_down.astype(y.dtype)))
    g = jnp.einsum("...r,rd->...d", h, w_up.astype(y.dtype), preferred_element_type=jnp.float32)
    return (y.astype(jnp.float32) * jax.nn.sigmoid(g)).astype(y.dtype)


def causal_conv(x: jax.Array, kernel: jax.Array, segment_ids: jax.Array | None = None
                ) -> jax.Array:
    """Short causal depthwise convolution along axis 1, in residual form: x [B, S, ...],
    kernel [W, ...] (one tap per channel and lag) -> x_s + sum_{j < W} kernel[j] * x_{s-j}.
    A lag reaching before the row's start or into another segment (``segment_ids`` [B, S]:
    packed documents) reads zero, so no document sees another's tokens. Sums in float32."""
    W = kernel.shape[0]
    S = x.shape[1]
    x32 = x.astype(jnp.float32)
    k32 = kernel.astype(jnp.float32)
    out = x32
    for j in range(min(W, S)):
        shifted = jnp.pad(x32, [(0, 0), (j, 0)] + [(0, 0)] * (x.ndim - 2))[:, :S]   # x_{s-j}
        if segment_ids is not None and j:
            prev = jnp.pad(segment_ids, ((0, 0), (j, 0)), constant_values=-1)[:, :S]
            same = (prev == segment_ids).reshape(segment_ids.shape + (1,) * (x.ndim - 2))
            shifted = jnp.where(same, shifted, 0.0)
        out = out + k32[j] * shifted
    return out.astype(x.dtype)


def exclusive(y: jax.Array, v: jax.Array) -> jax.Array:
    """XSA (exclusive self-attention): y [B, S, H, Hd] minus its component along the head's own
    value vector v [B, S, K, Hd] at that position (head h reads KV head h // (H / K)):
    z = y - (y . v / |v|^2) v per head; a zero v leaves y unchanged. In float32."""
    H, K = y.shape[2], v.shape[2]
    v = jnp.repeat(v.astype(jnp.float32), H // K, axis=2)                  # [B, S, H, Hd]
    y32 = y.astype(jnp.float32)
    vv = jnp.sum(v * v, axis=-1, keepdims=True)
    coef = jnp.sum(y32 * v, axis=-1, keepdims=True) / jnp.where(vv > 0, vv, 1.0)
    return (y32 - jnp.where(vv > 0, coef, 0.0) * v).astype(y.dtype)


def head_gate(x: jax.Array, w_gate: jax.Array) -> jax.Array:
    """The attention head gate: x [B, S, D] -> [B, S, H] float32, 2 sigmoid(x . w_gate_h)
    (w_gate [D, H], zero init: every gate starts at 1)."""
    logits = jnp.einsum("bsd,dh->bsh", x, w_gate.astype(x.dtype),
                        preferred_element_type=jnp.float32)
    return 2.0 * jax.nn.sigmoid(logits)


class Attention(nn.Module):
    """Causal self-attention: QK-norm, partial RoPE, grouped KV heads, a sliding window on local
    layers (``cfg.is_global``). x [B, S, D] in the compute dtype (weights arrive cast),
    segment_ids [B, S] or None. The recipe's switches (model/config.py) sit where the code shows."""

    cfg: ModelConfig
    layer: int

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg
        B, S, D = x.shape
        H, K, Hd = cfg.n_heads, cfg.n_kv_heads(self.layer), cfg.head_dim
        init = weight_init(cfg)
        wq = self.param("q", init, (D, H, Hd), jnp.float32)
        wk = self.param("k", init, (D, K, Hd), jnp.float32)
        wv = self.param("v", init, (D, K, Hd), jnp.float32)
        wo = self.param("o", output_init(cfg), (H, Hd, D), jnp.float32)

        q = jnp.einsum("bsd,dhx->bshx", x, wq)                     # [B, S, H, Hd]
        k = jnp.einsum("btd,dkx->btkx", x, wk)                     # [B, T, K, Hd]
        v = jnp.einsum("btd,dkx->btkx", x, wv)                     # [B, T, K, Hd]
        if cfg.conv_kernel:
            k = causal_conv(k, self.param("k_conv", zeros, (cfg.conv_kernel, K, Hd),
                                          jnp.float32), segment_ids)
        if cfg.qk_norm == "learned":
            q = RMSNorm(cfg.norm_eps, name="q_norm")(q)            # QK-norm over Hd
            k = RMSNorm(cfg.norm_eps, name="k_norm")(k)
        else:                        # non-parametric, the recipe's own eps (not norm_eps)
            q = rms_norm(q, 1.0, QK_RMS_EPS)
            k = rms_norm(k, 1.0, QK_RMS_EPS)
        if cfg.qk_mult != 1.0:
            q = q * jnp.asarray(cfg.qk_mult, q.dtype)
        positions = jnp.arange(S)
        rope_dim = cfg.layer_rope_dim(self.layer)
        q = rope(q, positions, rope_dim, cfg.rope_theta)
        k = rope(k, positions, rope_dim, cfg.rope_theta)

        window = None if cfg.is_global(self.layer) else cfg.local_window
        out = attend(q, k, v, window, segment_ids, cfg.attention_chunk)   # [B, S, H, Hd]
        if cfg.xsa:
            out = exclusive(out, v)
        if cfg.head_gate:
            gate = head_gate(x, self.param("attn_gate", zeros, (D, H), jnp.float32))
            out = (out.astype(jnp.float32) * gate[..., None]).astype(out.dtype)
        y = jnp.einsum("bshx,hxd->bsd", out, wo)                   # [B, S, D]
        if cfg.conv_kernel:
            y = causal_conv(y, self.param("out_conv", zeros, (cfg.conv_kernel, D), jnp.float32),
                            segment_ids)
        return y
