"""Dense building blocks: RMSNorm, partial RoPE, causal attention with QK-norm and grouped KV heads.

Axis legend (as in model/config.py): B batch, S sequence (query positions), T sequence (key
positions, or flattened tokens B*S in model/moe.py), D model width, H query heads, K KV heads,
G query heads per KV head (H = K * G), Hd head dim.
Einsum letters: b=B, s=S, t=T, d=D, h=H, k=K, g=G, x=Hd.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct
from flax.core import meta, unfreeze
from flax.traverse_util import flatten_dict, unflatten_dict

from model.config import ModelConfig


# ------------------------------------------------------------------------------------ init
@struct.dataclass
class Init(meta.AxisMetadata):
    """A parameter boxed with how it was initialised: normal(0, std), or ones when std is None.

    The box survives ``jax.eval_shape`` (std is static), so ``model.init`` reads every
    parameter's shape and init rule from one abstract trace and draws the values with numpy:
    XLA compiles jax.random samplers slowly on CPU (measured here: ~17 s to jit the linen init
    of the largest cpu-ladder rung). Linen unboxes it whenever a module reads the parameter.
    """

    value: Any
    std: float | None = struct.field(pytree_node=False)

    def unbox(self):
        return self.value

    def replace_boxed(self, val):
        return self.replace(value=val)

    def add_axis(self, index, params):
        return self

    def remove_axis(self, index, params):
        return self


def normal(std: float):
    """Linen initializer: normal(0, std), boxed with its std."""
    def init(key, shape, dtype=jnp.float32):
        return Init(std * jax.random.normal(key, shape, dtype), std)
    return init


def ones(key, shape, dtype=jnp.float32):
    """Linen initializer for norm scales: ones, boxed."""
    return Init(jnp.ones(shape, dtype), None)


def materialize(boxes, seed: int, slices=None) -> dict:
    """Nested dict of Init(ShapeDtypeStruct, std) (``jax.eval_shape`` of a linen init) -> nested
    dict of arrays. Each parameter is drawn from its own numpy stream seeded by (seed, its path),
    so its initial value does not depend on which other parameters exist.

    ``slices(path)``: for a parameter stacked on a leading axis (the scanned layers), the path
    each slice is drawn under (None: not stacked). The scanned model then starts from the very
    values the same model has with its layers unrolled."""
    def draw(path, shape, std):
        rng = np.random.default_rng([seed, zlib.crc32("/".join(path).encode())])
        return std * rng.standard_normal(shape, dtype=np.float32)

    values = {}
    for path, box in flatten_dict(unfreeze(boxes)).items():
        shape, dtype = box.value.shape, box.value.dtype
        if box.std is None:
            values[path] = jnp.ones(shape, dtype)
            continue
        parts = slices(path) if slices is not None else None
        if parts is None:
            values[path] = jnp.asarray(draw(path, shape, box.std), dtype)
        else:                                           # [G, ...]: slice g drawn as parts[g]
            values[path] = jnp.asarray(np.stack([draw(p, shape[1:], box.std) for p in parts]),
                                       dtype)
    return unflatten_dict(values)


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
    """Rotary position embedding on the first ``rope_dim`` channels of each head.

    x [B, S, N, Hd] (N heads), positions [S]. Channel i is paired with channel i + rope_dim/2
    ("rotate-half" layout); the remaining Hd - rope_dim channels carry no position.
    """
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


def attention_mask(seq_len: int, window: int | None) -> jax.Array:
    """[S, T] bool: query s may read key t iff t <= s (causal) and s - t < window (local layers;
    the window counts the current token)."""
    s = jnp.arange(seq_len)[:, None]
    t = jnp.arange(seq_len)[None, :]
    mask = t <= s
    if window is not None:
        mask = mask & (s - t < window)
    return mask


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """segment_ids [B, S] int32 -> [B, 1, S, T] bool: query s may read key t only within its own
    segment (packed documents do not see each other)."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def attention_implementation(dtype, head_dim: int) -> str:
    """"cudnn" (flash attention: no S x T scores in memory) on GPU for the shapes it takes
    (bf16/fp16, head dim a multiple of 8 up to 128, per jax.nn.dot_product_attention's cuDNN
    path), else "xla" (a masked softmax over the full S x T scores)."""
    ok = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if ok and jax.default_backend() == "gpu" else "xla"


def attend(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
           segment_ids: jax.Array | None = None, chunk: int | None = None) -> jax.Array:
    """Causal attention through ``jax.nn.dot_product_attention``: q [B, S, H, Hd], k and v
    [B, T, K, Hd] with H a multiple of K (head h reads KV head h // (H / K)) -> [B, S, H, Hd].

    ``window``: each query sees the last ``window`` keys, itself included (None: all earlier
    keys). ``segment_ids`` [B, S] int32: a query reads keys of its own segment only (None: one
    segment). The softmax runs in float32 whatever the input dtype (jax's XLA and cuDNN paths
    both do). Segments go in as a boolean mask, shared by all heads.

    On GPU (cuDNN flash attention) the call is whole: no S x T scores exist. Elsewhere XLA's
    attention builds the [B, H, S, T] scores, so with ``chunk`` < S the queries go in blocks of
    ``chunk`` (:func:`attend_chunked`), each block's scores recomputed in the backward pass.
    """
    impl = attention_implementation(q.dtype, q.shape[-1])
    if impl == "xla" and chunk is not None and q.shape[1] > chunk:
        return attend_chunked(q, k, v, window, segment_ids, chunk)
    mask = None if segment_ids is None else segment_mask(segment_ids)
    # jax's window (left, right) lets query s read keys s - left ... s + right
    local = None if window is None else (window - 1, 0)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                        local_window_size=local, implementation=impl)


def attend_chunked(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
                   segment_ids: jax.Array | None, chunk: int) -> jax.Array:
    """:func:`attend` over blocks of ``chunk`` queries (XLA path), under jax.checkpoint: at most
    one block's [B, H, chunk, span] float32 scores exist, forward or backward. A global layer's
    block reads all S keys (span = S, masked causally); a local layer's reads only the
    ``window - 1`` keys before the block and the block (span = window - 1 + chunk), so local
    layers also cost O(S x (window + chunk)) instead of O(S^2).
    Shapes as in :func:`attend`; S is padded to whole blocks, the padded queries dropped."""
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


def attend_reference(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
                     segment_ids: jax.Array | None = None) -> jax.Array:
    """Slow, obviously correct twin of :func:`attend` (the dense path the model used before):
    full [B, K, G, S, T] float32 scores, masked, softmaxed. For tests."""
    B, S, H, Hd = q.shape
    K = k.shape[2]
    G = H // K
    q = q.reshape(B, S, K, G, Hd)               # [B,S,H,Hd] -> [B,S,K,G,Hd]; head h = k*G + g
    scores = jnp.einsum("bskgx,btkx->bkgst", q, k).astype(jnp.float32) / math.sqrt(Hd)
    mask = attention_mask(S, window)[None, None, None]           # [1, 1, 1, S, T]
    if segment_ids is not None:
        mask = mask & segment_mask(segment_ids)[:, :, None]      # [B, 1, 1, S, T]
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)      # every row sees itself: no NaN
    out = jnp.einsum("bkgst,btkx->bskgx", probs, v)              # [B, S, K, G, Hd]
    return out.reshape(B, S, H, Hd)                              # [B,S,K,G,Hd] -> [B,S,H,Hd]


def output_init(cfg: ModelConfig):
    """Init of projections that write into the residual stream: std / sqrt(2 n_layers), so the
    residual variance does not grow with depth (GPT-2's scaling of residual projections,
    Radford et al. 2019, section 2.3)."""
    return normal(cfg.init_std / math.sqrt(2 * cfg.n_layers))


class Attention(nn.Module):
    """Causal self-attention: QK-norm, partial RoPE, grouped KV heads, optional sliding window.

    Layer ``layer`` is global (full causal) when ``cfg.is_global(layer)``, else local: each query
    sees the last ``cfg.local_window`` positions, itself included. x [B, S, D] in the compute
    dtype (the weights arrive already cast, see model.transformer), segment_ids [B, S] or None.
    """

    cfg: ModelConfig
    layer: int

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg
        B, S, D = x.shape
        H, K, Hd = cfg.n_heads, cfg.n_kv_heads(self.layer), cfg.head_dim
        init = normal(cfg.init_std)
        wq = self.param("q", init, (D, H, Hd), jnp.float32)
        wk = self.param("k", init, (D, K, Hd), jnp.float32)
        wv = self.param("v", init, (D, K, Hd), jnp.float32)
        wo = self.param("o", output_init(cfg), (H, Hd, D), jnp.float32)

        q = jnp.einsum("bsd,dhx->bshx", x, wq)                     # [B, S, H, Hd]
        k = jnp.einsum("btd,dkx->btkx", x, wk)                     # [B, T, K, Hd]
        v = jnp.einsum("btd,dkx->btkx", x, wv)                     # [B, T, K, Hd]
        q = RMSNorm(cfg.norm_eps, name="q_norm")(q)                # QK-norm over Hd
        k = RMSNorm(cfg.norm_eps, name="k_norm")(k)
        positions = jnp.arange(S)
        q = rope(q, positions, cfg.rope_dim, cfg.rope_theta)
        k = rope(k, positions, cfg.rope_dim, cfg.rope_theta)

        window = None if cfg.is_global(self.layer) else cfg.local_window
        out = attend(q, k, v, window, segment_ids, cfg.attention_chunk)   # [B, S, H, Hd]
        return jnp.einsum("bshx,hxd->bsd", out, wo)                # [B, S, D]
