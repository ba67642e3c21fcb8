"""The MoE layer: router, capacity-limited sort-based dispatch, routed experts in a latent space,
shared experts, and the router-bias balancing rules.

Axis legend (as in model/config.py): T tokens (B*S flattened), D model width, E routed experts,
k chosen experts per token (top_k), L latent width, F expert hidden width, C expert capacity,
N shared experts, A assignments (T*k, token-major: assignment a = t*k + j).
Einsum letters: t=T, d=D, e=E, j=k, l=L, f=F, c=C, n=N.

- Routing (the real recipe): float32 logits of the full-width token; top-k of logits +
  router_bias; combine weights from the *unbiased* logits (:func:`route`). The bias is an input
  under stop_gradient, moved only by :func:`update_router_bias`.
- Capacity (issue 22 item 2): each expert takes at most C assignments of each cell of
  ``cfg.capacity_tokens`` consecutive tokens (:func:`capacity`, :func:`cell_tokens`), in
  :func:`drop_keys`' order; a dropped assignment's output is zero. Dropless mode (evaluation)
  computes every assignment (:func:`dispatch_dropless`).
- Expert parallelism: under a ``jax.set_mesh`` mesh with an "expert" axis of several devices,
  the routed path runs in ``jax.shard_map`` (:func:`routed_expert_parallel`). The mesh comes
  from the context, so the layer also works inside ``nn.scan``.
- Balancing over a step (microbatches, devices): ``aux["bias_stat"]`` is this call's share of
  the rule's statistic, :func:`merge_bias_stat` combines two exactly, and
  :func:`bias_target_from_stat` turns the merged one into the target (:func:`step_tokens`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ladder.model import balance
from ladder.model.config import BiasRule, ModelConfig
from ladder.model.layers import RMSNorm, output_init, weight_init


class Routing(NamedTuple):
    expert: jax.Array   # [T, k] int32: chosen experts, best first
    weight: jax.Array   # [T, k] float32: combine weights, summing to route_scale per token


def capacity(cfg: ModelConfig, n_tokens: int, *, dropless: bool = False) -> int:
    """Slots per expert in a cell of ``n_tokens`` tokens: ceil(cf * n * k / E), at most n (no
    expert can receive more than n)."""
    if dropless:
        return n_tokens
    return min(n_tokens, math.ceil(cfg.capacity_factor * n_tokens * cfg.top_k / cfg.n_experts))


def cell_tokens(cfg: ModelConfig, n_tokens: int) -> int:
    """Tokens per capacity cell in a call of ``n_tokens`` tokens (one device's share under a
    mesh): ``cfg.capacity_tokens``, which must divide them; None, or a call shorter than one
    cell (``ladder run`` refuses that layout: trainer/trainconfig.py::check_cell): the call."""
    cell = min(cfg.capacity_tokens or n_tokens, n_tokens)
    if n_tokens % cell:
        raise ValueError(f"capacity_tokens: a cell of {cell} tokens does not divide the "
                         f"{n_tokens} tokens of one call (per device): give each device whole "
                         f"cells (a larger microbatch)")
    return cell


_DROP_SEED: contextvars.ContextVar = contextvars.ContextVar("drop_seed", default=0)
_STEP_TOKENS: contextvars.ContextVar[int | None] = contextvars.ContextVar("step_tokens",
                                                                         default=None)


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value):
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def drop_order(seed):
    """Within this context (at trace time) the capacity drop order is drawn from ``seed`` (an
    int or a traced int32 scalar: the train step's counter). Outside it the seed is 0."""
    return _setting(_DROP_SEED, seed)


def step_tokens(n: int):
    """Within this context (at trace time) the balancing rule's statistic is sized for a step of
    ``n`` tokens (a microbatched step's whole), so the merged statistic equals one batch's."""
    return _setting(_STEP_TOKENS, int(n))


def _mix32(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser (Appleby, public domain): a bijection of uint32 whose
    output bits each depend on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def drop_keys(seed, T: int, k: int, cell: int, seq: int) -> jax.Array:
    """[T, k] uint32 drop priorities (lower keeps its slot) of T tokens in sequences of ``seq``
    and cells of ``cell``: high bits a hash of ``seed`` and of the sequence's place in its cell
    (a new order of the cell's sequences every seed, so no place loses more often), low bits
    the position in the sequence (earlier first: Switch/GShard's position priority). A function
    of places in the cell only, so the same on any layout holding whole cells; causal, since
    order within a sequence is by position (tests/test_model_decoder.py::test_causal). Not by
    router score: its last bits depend on the layout's reduction order."""
    run = min(seq, cell)                                                     # causal stretch
    low = max(1, (run * k - 1).bit_length())                                 # bits of pos * k + j
    if low > 24:
        raise ValueError(f"capacity_tokens: sequences of {seq} tokens x top-{k} leave too few "
                         f"bits of a 32-bit drop key for the sequence order")
    place = jnp.arange(T, dtype=jnp.uint32) % jnp.uint32(cell)               # [T]
    which, pos = place // jnp.uint32(run), place % jnp.uint32(run)           # [T], [T]
    mixed = _mix32(jnp.asarray(seed).astype(jnp.uint32) * jnp.uint32(0x9E3779B9)
                   + jnp.uint32(0x7F4A7C15))
    high = _mix32(which ^ mixed) >> jnp.uint32(low)                          # [T]
    return ((high << jnp.uint32(low)) | (pos * jnp.uint32(k)))[:, None] \
        + jnp.arange(k, dtype=jnp.uint32)[None, :]                           # [T, k]


def route(cfg: ModelConfig, logits: jax.Array, bias: jax.Array) -> Routing:
    """logits [T, E] float32 (unbiased), bias [E] -> the chosen experts and their weights."""
    biased = logits + jax.lax.stop_gradient(bias)[None, :]
    _, expert = balance.top_k_rows(biased, cfg.top_k)                  # [T, k]
    chosen = jnp.take_along_axis(logits, expert, axis=-1)             # [T, k] unbiased logits
    if cfg.combine == "sigmoid":
        gate = jax.nn.sigmoid(chosen)
        weight = gate / jnp.sum(gate, axis=-1, keepdims=True)
    else:  # "softmax" over the chosen k
        weight = jax.nn.softmax(chosen, axis=-1)
    return Routing(expert=expert.astype(jnp.int32), weight=weight * cfg.route_scale)


# ------------------------------------------------------------------------------------ dispatch
ExpertFn = Callable[[jax.Array], jax.Array]   # [E, C, L] -> [E, C, L], each expert on its row


class Dispatched(NamedTuple):
    out: jax.Array    # [T, k, L]: each assignment's expert output, zeros where dropped
    kept: jax.Array   # [T, k] bool: the assignment got a slot


class Slots(NamedTuple):
    """Where each assignment goes in an [E, n_cells * C, L] buffer (:func:`slots`)."""
    order: jax.Array          # [A] assignment index of each sorted position
    expert: jax.Array         # [A] expert of each sorted position
    slot: jax.Array           # [A] slot of its expert; ``n_cells * cap`` (out of range): dropped
    kept: jax.Array           # [A] bool, sorted order


def slots(expert: jax.Array, n_experts: int, cap: int, key: jax.Array | None = None,
          n_cells: int = 1) -> Slots:
    """expert [T, k] -> the slot of every assignment: sorted by (cell of T / n_cells consecutive
    tokens, expert, ``key`` [T, k] ascending (None: none), assignment order), an assignment's
    rank in its (cell, expert) run is its slot in the cell (cell c owns slots [c * C, (c + 1)
    * C)); ranks >= cap are dropped."""
    T, k = expert.shape
    A, E = T * k, n_experts
    flat = expert.reshape(A)                                   # [T, k] -> [A], a = t*k + j
    cell = (jnp.arange(A) // k) // (T // n_cells)              # [A] cell of each assignment
    run = cell * E + flat                                      # [A] (cell, expert) run
    if key is None:
        order = jnp.argsort(run, stable=True)                  # [A]
    else:                                                      # one sort by (run, key)
        order = jax.lax.sort((run, key.reshape(A), jnp.arange(A, dtype=jnp.int32)), num_keys=2,
                             is_stable=True)[2]
    sorted_run = run[order]                                    # [A]
    counts = jnp.bincount(run, length=n_cells * E)             # [n_cells * E]
    starts = jnp.cumsum(counts) - counts                       # first sorted index of each run
    rank = jnp.arange(A) - starts[sorted_run]                  # [A] position within its run
    kept = rank < cap
    slot = (sorted_run // E) * cap + rank                      # cell c's slots start at c * cap
    return Slots(order, sorted_run % E, jnp.where(kept, slot, n_cells * cap), kept)


def zeros_after(x: jax.Array, shape: tuple) -> jax.Array:
    """Zeros of ``x``'s dtype in ``shape``, computed from ``x`` (one element times zero; NaN in
    ``x``: NaN), so that the buffer cannot be made before ``x`` exists: XLA:CPU made copies of a
    shared constant zero buffer at the start of the pass (27 GiB at the 27.7B-A1.2B eval step's
    peak; docs/LOG.md)."""
    return jnp.broadcast_to((x.reshape(-1)[0] * 0).astype(x.dtype), shape)


def dispatch_sorted(expert_fn: ExpertFn, x: jax.Array, expert: jax.Array, n_experts: int,
                    cap: int, key: jax.Array | None = None, n_cells: int = 1) -> Dispatched:
    """Run each token's chosen experts with at most ``cap`` assignments per (cell, expert):
    x [T, L], expert [T, k], key [T, k] (:func:`slots`) -> Dispatched. Scatter into an
    [E, n_cells * C, L] buffer, one batched einsum, gather back (on CPU ~5x faster than a
    one-hot mask over every expert, ~7x than jax.lax.ragged_dot: bench/moe_dispatch.py)."""
    T, k = expert.shape
    s = slots(expert, n_experts, cap, key, n_cells)
    buf = zeros_after(x, (n_experts, n_cells * cap, x.shape[-1]))
    buf = buf.at[s.expert, s.slot].set(x[s.order // k], mode="drop")  # [E, n_cells * C, L]
    out = expert_fn(buf)
    out_sorted = out.at[s.expert, s.slot].get(mode="fill", fill_value=0)     # [A, L]
    out_flat = zeros_after(out, out_sorted.shape).at[s.order].set(out_sorted)   # unsort: [A, L]
    kept = jnp.zeros((T * k,), bool).at[s.order].set(s.kept)
    return Dispatched(out_flat.reshape(T, k, -1), kept.reshape(T, k))   # [A, L] -> [T, k, L]


# ------------------------------------------------------------------------------ dropless
# The dropless grouped matmul. Not jax.lax.ragged_dot: jaxlib 0.10.2 expands it on CPU into one
# dense dot over every group, E x the FLOPs (issue 22; bench/dropless_dispatch.py), and XLA:GPU
# does the same unless its cuDNN ragged-dot fusion fires (docs/LOG.md). Here each expert's run of
# assignments is padded to whole blocks and multiplied block by block: plain gathers, scatters
# and batched dots, FLOPs of rows + E x (block - 1) rows.
MIN_BLOCK, MAX_BLOCK = 8, 128
ROWS_PER_STEP = 4096            # rows of the block loop's one step (fewer, larger dots)
GATHER_BYTES_PER_STEP = 2**26   # at most this many bytes of expert weights gathered per step


def group_block(rows: int, groups: int) -> int:
    """Rows per block of :func:`grouped_swiglu` for ``rows`` rows over ``groups`` groups: the
    largest power of two <= rows / groups, within [8, 128] (so at most 2 x rows computed; the
    fastest or within 1.6x of it at 8, 32 and 128 experts on CPU: bench/dropless_dispatch.py)."""
    b = MIN_BLOCK
    while b * 2 <= min(MAX_BLOCK, rows // groups):
        b *= 2
    return b


def grouped_swiglu(x_blocks: jax.Array, block_group: jax.Array, w_gate, w_up, w_down
                   ) -> jax.Array:
    """SwiGLU experts on blocks of rows, each block through one expert: x_blocks [n, b, L],
    block_group [n] (the expert of each block), weights [E, L, F] / [E, F, L] -> [n, b, L].
    Under ``jax.lax.scan``, c blocks a step (about ROWS_PER_STEP rows, at most
    GATHER_BYTES_PER_STEP bytes of gathered weights), three batched dots each."""
    n, b, L = x_blocks.shape
    F = w_gate.shape[-1]
    per_block = 3 * L * F * jnp.dtype(w_gate.dtype).itemsize
    steps = -(-n // max(1, min(n, ROWS_PER_STEP // b, GATHER_BYTES_PER_STEP // per_block)))
    c = -(-n // steps)                               # blocks per step, spread evenly
    pad = steps * c - n                              # < steps blocks of zeros
    xs = jnp.pad(x_blocks, ((0, pad), (0, 0), (0, 0))).reshape(steps, c, b, L)
    gs = jnp.pad(block_group, (0, pad)).reshape(steps, c)

    def step(_, inp):
        xb, g = inp                                                  # [c, b, L], [c]
        out = swiglu(xb, w_gate[g], w_up[g], w_down[g], "cbl,clf->cbf", "cbf,cfl->cbl")
        return None, out                                             # [c, b, L]

    _, out = jax.lax.scan(step, None, (xs, gs))                      # [steps, c, b, L]
    return out.reshape(steps * c, b, L)[:n]


def dispatch_dropless(x: jax.Array, expert: jax.Array, weights: tuple,
                      block: int | None = None) -> jax.Array:
    """Dropless: every assignment through its expert, with no capacity and no [E, T, L] buffer.
    x [T, L], expert [T, k], weights of all E experts ([E, L, F], [E, L, F], [E, F, L])
    -> out [T, k, L]. Sorted by expert, expert e's n_e assignments take ceil(n_e / b) zero-padded
    blocks of b = ``block`` rows (default :func:`group_block`); the block count is a static bound
    (unused blocks compute zeros)."""
    T, k = expert.shape
    E, L = weights[0].shape[0], x.shape[-1]
    A = T * k
    b = block or group_block(A, E)
    flat = expert.reshape(A)                                   # [T, k] -> [A], a = t*k + j
    order = jnp.argsort(flat, stable=True)                     # [A] grouped by expert
    sorted_expert = flat[order]
    counts = jnp.bincount(flat, length=E)                      # [E]
    rank = jnp.arange(A) - (jnp.cumsum(counts) - counts)[sorted_expert]   # [A] within expert
    blocks = -(-counts // b)                                   # [E] blocks of each expert
    block_end = jnp.cumsum(blocks)                             # [E]
    dest = (block_end - blocks)[sorted_expert] * b + rank      # [A] padded row of each
    n_blocks = (A + min(E, A) * (b - 1)) // b                  # >= sum(blocks), static
    buf = zeros_after(x, (n_blocks * b, L)).at[dest].set(x[order // k], unique_indices=True)
    block_expert = jnp.minimum(jnp.searchsorted(block_end, jnp.arange(n_blocks), side="right"),
                               E - 1)                          # [n_blocks]; unused: any expert
    out = grouped_swiglu(buf.reshape(n_blocks, b, L), block_expert, *weights)   # [n, b, L]
    out_sorted = out.reshape(n_blocks * b, L)[dest]                             # [A, L]
    out = zeros_after(out, out_sorted.shape).at[order].set(out_sorted,
                                                           unique_indices=True)   # unsort
    return out.reshape(T, k, L)                                # [A, L] -> [T, k, L]


def dispatch_dropless_sharded(mesh, x: jax.Array, expert: jax.Array, weights: tuple
                              ) -> jax.Array:
    """:func:`dispatch_dropless` under ``jax.shard_map`` over ``mesh``: each device runs its own
    tokens through every expert, whose weights GSPMD all-gathers (0.34 GB per layer in bf16 at
    1.6B-A61M; an all-to-all's dropless receive buffer would need ep x the assignments)."""
    tok = P(tuple(mesh.axis_names))
    return jax.shard_map(lambda x, e, *w: dispatch_dropless(x, e, w), mesh=mesh,
                         in_specs=(tok, tok, P(), P(), P()), out_specs=tok)(x, expert, *weights)


def expert_mesh(n_tokens: int):
    """The abstract mesh in context when the routed path runs sharded over it (an "expert" axis,
    :func:`balance.rows_mesh`), else None."""
    mesh = balance.rows_mesh(n_tokens)
    return mesh if mesh is not None and "expert" in mesh.axis_names else None


def split_batch(x: jax.Array) -> jax.Array:
    """``x`` [B, ...] constrained to its rows split over every device of the mesh in context
    (unchanged without one, or when the devices do not divide B). Else GSPMD may follow the
    weights: the embedding gather from a vocab-split table came out replicated (373 GiB per
    device at 27.7B-A1.2B on 64 devices, ``ladder plan --compile``)."""
    mesh = balance.rows_mesh(x.shape[0])
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(tuple(mesh.axis_names))))


def compact_slots(s: Slots, n_experts: int, cap: int, n_cells: int) -> tuple[Slots, jax.Array]:
    """The same assignments and drops as ``s``, each expert's kept ones moved to the front of its
    row of the [E, n_cells * cap, L] buffer (cell after cell, in rank order) -> (slots, filled
    [E]: kept rows of each expert), so each expert's rows go as one slice (exchange_ragged)."""
    e = s.expert                                                           # [A] sorted order
    cell = jnp.where(s.kept, s.slot // cap, n_cells)                       # [A]; dropped: row n
    kept = jnp.zeros((n_cells + 1, n_experts), jnp.int32).at[cell, e].add(1)[:n_cells]
    before = jnp.cumsum(kept, axis=0) - kept                               # [n_cells, E]
    slot = jnp.where(s.kept, before[jnp.minimum(cell, n_cells - 1), e] + s.slot % cap,
                     n_cells * cap)                                        # [A]
    return s._replace(slot=slot), jnp.sum(kept, axis=0)


class Exchange(NamedTuple):
    """How the routed path moves an [E, n, L] buffer of slots to the devices holding the experts
    and back, under ``jax.shard_map`` over "expert" (ep devices, E/ep experts each):
    ``there(buf, filled) -> [E/ep, ep * n, L]`` (local expert, then sender, then slot) and
    ``back(out, filled) -> [E, n, L]``; ``filled`` [E] counts the rows in use at the front of
    each expert's n (:func:`compact_slots`)."""
    there: Callable
    back: Callable


def _ragged_layout(filled, E, n, ep):
    """Offsets and sizes of both trips (jax.lax.ragged_all_to_all's arguments): slice e of
    the way there is expert e's filled rows, sent to device e // (E/ep) into its block
    (local expert, this sender); the way back returns each block to its sender's row e."""
    n_here = E // ep
    me = jax.lax.axis_index("expert")
    e = jnp.arange(E, dtype=jnp.int32)
    le = e % n_here                                      # local expert on its device
    src = e // n_here                                    # way back: slice i = src * n_here + le
    recv = jax.lax.all_to_all(filled, "expert", 0, 0, tiled=True)   # [E]: my expert le from src
    there = (e * n, filled, (le * ep + me) * n, recv)
    back = ((le * ep + src) * n, recv, (me * n_here + le) * n, filled)
    return there, back


def exchange_dense(ep: int) -> Exchange:
    """Two ``jax.lax.all_to_all`` of the whole padded buffer (every slot, used or not)."""
    def there(buf, filled):
        E, n, L = buf.shape
        # block i of E/ep experts -> device i; received: block j = sender j's slots for mine
        buf = jax.lax.all_to_all(buf, "expert", 0, 0, tiled=True)             # [ep*E/ep, n, L]
        return buf.reshape(ep, E // ep, n, L).transpose(1, 0, 2, 3).reshape(E // ep, ep * n, L)

    def back(out, filled):
        n_here, m, L = out.shape
        n = m // ep
        out = out.reshape(n_here, ep, n, L).transpose(1, 0, 2, 3).reshape(ep * n_here, n, L)
        return jax.lax.all_to_all(out, "expert", 0, 0, tiled=True)           # home: [E, n, L]

    return Exchange(there, back)


def exchange_ragged(ep: int, a2a: Callable | None = None) -> Exchange:
    """Two ragged all-to-alls of the filled rows only (``a2a``: jax.lax.ragged_all_to_all over
    "expert", or a stand-in with its arguments in tests); the receiving buffers keep their
    padded shape (a static worst case), only the bytes on the wire shrink."""
    a2a = a2a or partial(jax.lax.ragged_all_to_all, axis_name="expert")

    def there(buf, filled):
        E, n, L = buf.shape
        sizes = _ragged_layout(filled, E, n, ep)[0]
        out = a2a(buf.reshape(E * n, L), jnp.zeros((E * n, L), buf.dtype), *sizes)
        return out.reshape(E // ep, ep * n, L)                               # [E/ep, ep*n, L]

    def back(out, filled):
        n_here, m, L = out.shape
        E, n = n_here * ep, m // ep
        sizes = _ragged_layout(filled, E, n, ep)[1]
        home = a2a(out.reshape(E * n, L), jnp.zeros((E * n, L), out.dtype), *sizes)
        return home.reshape(E, n, L)                                         # [E, n, L]

    return Exchange(there, back)


# XLA:CPU has no ragged all-to-all ("HLO opcode ragged-all-to-all is not supported by XLA:CPU
# ThunkEmitter", jaxlib 0.10.2), so CPU keeps the dense exchange; XLA:GPU and TPU implement it.
RAGGED_BACKENDS = ("gpu", "tpu")


def default_exchange(ep: int) -> Exchange:
    """The exchange for this backend: ragged where XLA implements it, else dense."""
    return exchange_ragged(ep) if jax.default_backend() in RAGGED_BACKENDS else \
        exchange_dense(ep)


def routed_expert_parallel(cfg: ModelConfig, mesh, x: jax.Array, expert: jax.Array,
                           weight: jax.Array, seed, weights: tuple, seq: int,
                           exchange: Exchange | None = None) -> tuple[jax.Array, jax.Array]:
    """The routed path with capacity, and its combine, under ``jax.shard_map`` over ``mesh``:
    tokens split over every device, expert weights over "expert". x [T, L], expert [T, k],
    weight [T, k] (combine weights) -> (mixed [T, L], kept [T, k]).

    Each device fills C slots per (cell, expert) of its own tokens (the drops one device would
    make), kept rows first (:func:`compact_slots`), and ``exchange`` (default
    :func:`default_exchange`) sends each block of E/ep experts to their device and the outputs
    back. Slots gather straight from the tokens and outputs add straight into their tokens'
    rows: no [t * k, L] array, nor a zero-filled [E, n, L] buffer in the backward pass, the
    largest buffers of the 27.7B-A1.2B step under XLA:CPU (docs/LOG.md). The sum over a token's
    k outputs is taken in another order than :func:`combine`'s."""
    E, ep = cfg.n_experts, mesh.shape["expert"]
    tok, wspec = P(tuple(mesh.axis_names)), P("expert")
    exchange = exchange or default_exchange(ep)

    def local(x, expert, weight, seed, w_gate, w_up, w_down):   # [t, L], [t, k], [t, k], ...
        t, k = expert.shape
        cell = cell_tokens(cfg, t)
        cap = capacity(cfg, cell)
        n = (t // cell) * cap                                          # slots per expert here
        s, filled = compact_slots(slots(expert, E, cap, drop_keys(seed, t, k, cell, seq),
                                        t // cell), E, cap, t // cell)
        # each slot's token (t: the zero row) and combine weight (0 when empty)
        src = jnp.full((E, n), t, jnp.int32).at[s.expert, s.slot].set(
            (s.order // k).astype(jnp.int32), mode="drop")             # [E, n]
        w_slot = jnp.zeros((E, n), weight.dtype).at[s.expert, s.slot].set(
            weight.reshape(t * k)[s.order], mode="drop")               # [E, n]
        rows = jnp.concatenate([x, zeros_after(x, (1, x.shape[-1]))])  # [t + 1, L]
        buf = exchange.there(rows[src], filled)                        # [E/ep, ep*n, L]
        out = swiglu(buf, w_gate, w_up, w_down, "ecl,elf->ecf", "ecf,efl->ecl")
        out = exchange.back(out, filled)                               # home: [E, n, L]
        mixed = zeros_after(out, (t + 1, out.shape[-1])).at[src].add(
            out * w_slot.astype(out.dtype)[..., None])[:t]             # [t, L]
        kept = jnp.zeros((t * k,), bool).at[s.order].set(s.kept)
        return mixed, kept.reshape(t, k)

    return jax.shard_map(
        local, mesh=mesh, in_specs=(tok, tok, tok, P(), wspec, wspec, wspec),
        out_specs=(tok, tok))(x, expert, weight, jnp.asarray(seed, jnp.int32), *weights)


# ------------------------------------------------------------------------------------ experts
def swiglu(x, w_gate, w_up, w_down, spec_in: str, spec_out: str):
    """SwiGLU feed-forward: (silu(x Wg) * (x Wu)) Wd, with einsum specs for the two halves."""
    h = jax.nn.silu(jnp.einsum(spec_in, x, w_gate)) * jnp.einsum(spec_in, x, w_up)
    return jnp.einsum(spec_out, h, w_down)


class RoutedExperts(nn.Module):
    """E SwiGLU experts latent -> F -> latent, weights [E, ...] (the mesh's "expert" axis
    shards E); ``weights()`` hands them to the paths that run outside the module."""

    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        E, L, F = cfg.n_experts, cfg.latent_dim, cfg.expert_dim
        init = weight_init(cfg)
        self.gate = self.param("gate", init, (E, L, F), jnp.float32)
        self.up = self.param("up", init, (E, L, F), jnp.float32)
        self.down = self.param("down", init, (E, F, L), jnp.float32)

    def weights(self) -> tuple:
        return self.gate, self.up, self.down

    def __call__(self, buf: jax.Array) -> jax.Array:          # [E, C, L] -> [E, C, L]
        return swiglu(buf, self.gate, self.up, self.down, "ecl,elf->ecf", "ecf,efl->ecl")


class SharedExperts(nn.Module):
    """N full-width SwiGLU experts D -> shared_dim -> D that every token uses."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:            # [T, D] -> [T, D]
        cfg = self.cfg
        N, D, F = cfg.n_shared, cfg.d_model, cfg.shared_dim
        init = weight_init(cfg)
        w_gate = self.param("gate", init, (N, D, F), jnp.float32)
        w_up = self.param("up", init, (N, D, F), jnp.float32)
        w_down = self.param("down", output_init(cfg), (N, F, D), jnp.float32)
        return swiglu(x, w_gate, w_up, w_down, "td,ndf->tnf", "tnf,nfd->td")


# The name of the routed path's output [T, L], which remat "dots" keeps (model/transformer.py)
ROUTED_NAME = "moe_routed"


def combine(out: jax.Array, weight: jax.Array) -> jax.Array:
    """out [T, k, L] (each assignment's expert output), weight [T, k] -> [T, L]."""
    return jnp.einsum("tjl,tj->tl", out, weight.astype(out.dtype))


def recompute_at_backward(fn: Callable) -> Callable:
    """``fn`` whose backward pass recomputes it from its inputs *after* its output's cotangent
    exists (:func:`after_cotangent`); the same gradient. Not ``jax.checkpoint``: XLA:CPU ran
    that recomputation of every block of a scanned group at the start of the backward pass
    (27.7B-A1.2B: ~17 GiB of dispatch buffers per block at the peak; docs/LOG.md)."""
    f = jax.custom_vjp(fn)

    def fwd(*args):
        return fn(*args), args

    def bwd(args, ct):
        # integer inputs tied too: what depends on them alone (the sort into slots, its [A, L]
        # fill masks) was otherwise made for every block at once
        return jax.vjp(fn, *after_cotangent(ct, *args))[1](ct)

    f.defvjp(fwd, bwd)
    return f


def after_cotangent(ct, *arrays) -> tuple:
    """``arrays`` plus zero times one element of the cotangent ``ct`` (booleans as they are): a
    data dependency XLA keeps (x * 0 is not folded for floats), so what is computed from them
    waits for the cotangent (XLA:CPU dropped an ``optimization_barrier``; docs/LOG.md)."""
    real = [c for c in jax.tree.leaves(ct) if jnp.issubdtype(c.dtype, jnp.floating)]
    zero = real[0].reshape(-1)[0].astype(jnp.float32) * 0.0
    return tuple(a if a.dtype == jnp.bool_ else a + zero.astype(a.dtype) for a in arrays)


class MoE(nn.Module):
    """Router + routed experts in latent space + shared experts. Returns ``(y, aux)``.
    ``dispatch``: :func:`dispatch_sorted` (with its sharded and dropless twins) or, in tests, a
    reference with its signature."""

    cfg: ModelConfig
    dispatch: Callable = dispatch_sorted

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, dropless: bool = False):
        cfg = self.cfg
        B, S, D = x.shape
        T, E, L = B * S, cfg.n_experts, cfg.latent_dim
        xt = x.reshape(T, D)                                           # [B, S, D] -> [T, D]
        init = weight_init(cfg)
        w_router = self.param("router", init, (D, E), jnp.float32)
        w_down = self.param("down", init, (D, L), jnp.float32)
        w_up = self.param("up", output_init(cfg), (L, D), jnp.float32)

        # router in float32 on the full-width token
        logits = jnp.einsum("td,de->te", xt.astype(jnp.float32), w_router.astype(jnp.float32))
        routing = route(cfg, logits, bias)
        latent = RMSNorm(cfg.norm_eps, name="latent_norm")(jnp.einsum("td,dl->tl", xt, w_down))
        experts = RoutedExperts(cfg, name="experts")
        mesh = expert_mesh(T) if self.dispatch is dispatch_sorted else None
        per_call = T // mesh.size if mesh is not None else T           # one device's tokens
        cell = per_call if dropless else cell_tokens(cfg, per_call)
        if dropless and self.dispatch is dispatch_sorted:
            out = (dispatch_dropless(latent, routing.expert, experts.weights()) if mesh is None
                   else dispatch_dropless_sharded(mesh, latent, routing.expert,
                                                  experts.weights()))
            kept = jnp.ones(routing.expert.shape, bool)
            mixed = combine(out, routing.weight)                       # [T, L]
        elif mesh is not None:
            def routed(latent, weight, expert, seed, *w):           # -> [T, L], [T, k]
                return routed_expert_parallel(cfg, mesh, latent, expert, weight, seed, w, S)

            # remat dots: the buffers recomputed when the gradient reaches them (remat full
            # recomputes the whole block so, model/transformer.py call_block)
            if cfg.remat == "dots":
                routed = recompute_at_backward(routed)
            mixed, kept = routed(latent, routing.weight, routing.expert,
                                 jnp.asarray(_DROP_SEED.get(), jnp.int32), *experts.weights())
            mixed = checkpoint_name(mixed, ROUTED_NAME)                # kept by the remat
        else:
            key = drop_keys(_DROP_SEED.get(), T, cfg.top_k, cell, S)   # [T, k]
            out, kept = self.dispatch(experts, latent, routing.expert, E,
                                      capacity(cfg, cell, dropless=dropless), key,
                                      T // cell)                       # [T, k, L], [T, k]
            mixed = combine(out, routing.weight)                       # [T, L]
        y = jnp.einsum("tl,ld->td", mixed, w_up)                       # [T, D]
        if cfg.n_shared:
            y = y + SharedExperts(cfg, name="shared")(xt)
        aux = moe_stats(cfg, logits, routing, kept, stat=bias_stat(cfg, logits, mesh, bias))
        # the router's mean input [D]: what one step's router update does to the logits on
        # average (update_router_bias's drift correction)
        aux["router_in"] = jnp.mean(jax.lax.stop_gradient(xt).astype(jnp.float32), axis=0)
        return y.reshape(B, S, D), aux                                 # [T, D] -> [B, S, D]


# ------------------------------------------------------------------------------ stats and bias
def threshold_n(cfg: ModelConfig, n_tokens: int) -> int:
    """n of the threshold rule: T*k/E over the step's tokens (floored, at least 1)."""
    step = _STEP_TOKENS.get() or n_tokens
    return max(1, (step * cfg.top_k) // cfg.n_experts)


def top_logits(logits: jax.Array, n: int) -> jax.Array:
    """logits [T, E] -> [E, n]: each expert's n largest logits, descending, padded with -inf
    when T < n (a microbatch may hold fewer tokens than the step's n)."""
    T = logits.shape[0]
    top = jax.lax.top_k(jax.lax.stop_gradient(logits).T, min(n, T))[0]   # [E, min(n, T)]
    if T < n:
        top = jnp.pad(top, ((0, 0), (0, n - T)), constant_values=-jnp.inf)
    return top


# ------------------------------------------------------------------ the balancing rules
class BalancingRule:
    """One class per BiasRule member (:data:`RULES`). This base is ``none``: no statistic nor
    target, the bias stays as it is; the others override what they use."""

    def stat(self, cfg: ModelConfig, logits: jax.Array, mesh, bias) -> jax.Array:
        """This call's share of the statistic [E, n] (here [E, 1] zeros: none is needed)."""
        return jnp.zeros((logits.shape[1], 1), jnp.float32)

    def merge(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """The statistic of both token sets together, exactly."""
        return a

    def empty_fill(self) -> float:
        """The value of the statistic of no tokens (the identity of :meth:`merge`)."""
        return 0.0

    def target(self, cfg: ModelConfig, stat: jax.Array) -> jax.Array:
        """[..., E, n] statistic -> the target bias [..., E] (zeros: no target)."""
        return jnp.zeros(stat.shape[:-1], jnp.float32)

    def update(self, cfg: ModelConfig, router_bias: jax.Array, stats: dict,
               router_step: jax.Array | None) -> jax.Array:
        """The next step's bias [n_layers, E] (unrounded; :func:`update_router_bias` casts)."""
        return router_bias

    def stat_width(self, cfg: ModelConfig, step_tokens: int) -> int:
        """Numbers per expert the statistic holds for a step of ``step_tokens`` tokens (for
        ladder/trainer/plan.py)."""
        return 0


class TargetRule(BalancingRule):
    """A rule that replaces the bias by its target, less the drift of the router weights.

    ``router_step`` [n_layers, D, E] (new - old router weights) moves the next step's logits by
    x . router_step; its part common to all tokens, the mean input ``stats["moe/router_in"]``
    [n_layers, D] times the step, is taken off (centred over experts). Without it, where one
    Adam step moves an expert's logits further than their spread over tokens (small widths at
    the peak LR), every token picked the same experts for 10-30 steps (issue 37 item 6)."""

    def update(self, cfg, router_bias, stats, router_step):
        new = stats["moe/bias_target"]
        if router_step is not None:
            shift = jnp.einsum("ld,lde->le", stats["moe/router_in"].astype(jnp.float32),
                               router_step.astype(jnp.float32))                 # [L, E]
            new = new - (shift - jnp.mean(shift, axis=-1, keepdims=True))
        return new


class ThresholdRule(TargetRule):
    """Minus each expert's n-th largest raw logit over the step, n = T*k/E (:func:`threshold_n`),
    centred; from the top-n logits per expert [E, n], which merge by keeping the top-n."""

    def stat(self, cfg, logits, mesh, bias):
        n = threshold_n(cfg, logits.shape[0])
        if mesh is None:
            return top_logits(logits, n)
        others = tuple(a for a in mesh.axis_names if a != "expert")

        def local(lg):                                 # [t, E] -> [E/ep, n]
            top = top_logits(lg, min(n, lg.shape[0]))                     # [E, m]
            # experts to their "expert" device, candidates of all senders side by side
            top = jax.lax.all_to_all(top, "expert", 0, 1, tiled=True)     # [E/ep, ep*m]
            top = jax.lax.top_k(top, min(n, top.shape[1]))[0]
            if others:
                top = jax.lax.all_gather(top, others, axis=1, tiled=True)   # [E/ep, dp*m']
                top = jax.lax.top_k(top, min(n, top.shape[1]))[0]
            if top.shape[1] < n:
                top = jnp.pad(top, ((0, 0), (0, n - top.shape[1])), constant_values=-jnp.inf)
            return top

        # all_gather leaves its result typed "varying" over the other axes although every device
        # of them holds the same merged top-n: the replication check cannot see it, so it is off
        return jax.shard_map(local, mesh=mesh, in_specs=P(tuple(mesh.axis_names)),
                             out_specs=P("expert"), check_vma=False)(logits)

    def merge(self, a, b):
        n = a.shape[-1]
        return jax.lax.top_k(jnp.concatenate([a, b], axis=-1), n)[0]

    def empty_fill(self):
        return -jnp.inf

    def target(self, cfg, stat):
        bias = -stat[..., -1]              # centred: a common shift changes no top-k choice
        return bias - jnp.mean(bias, axis=-1, keepdims=True)

    def stat_width(self, cfg, step_tokens):
        return max(1, step_tokens * cfg.top_k // cfg.n_experts)


class QuantileRule(TargetRule):
    """The hero recipe's: minus each expert's upper K/E margin quantile under the layer's current
    bias, from margin histograms [E, N_BINS] that merge by adding (ladder/model/balance.py)."""

    def stat(self, cfg, logits, mesh, bias):
        if bias is None:
            raise ValueError("bias_rule quantile: the statistic needs the layer's current bias")
        # a sum: GSPMD adds the devices'
        return balance.margin_histogram(logits, bias, cfg.top_k)

    def merge(self, a, b):
        return a + b

    def target(self, cfg, stat):
        return balance.bias_from_histogram(stat, cfg.top_k)

    def stat_width(self, cfg, step_tokens):
        return balance.N_BINS


class SignRule(BalancingRule):
    """bias += bias_rate * sign(mean load - load), per layer (loss-free balancing, Wang et al.
    2024, "Auxiliary-loss-free load balancing strategy for mixture-of-experts")."""

    def update(self, cfg, router_bias, stats, router_step):
        load = stats["moe/load"]                                       # [n_layers, E]
        return router_bias + cfg.bias_rate * jnp.sign(jnp.mean(load, axis=-1, keepdims=True)
                                                      - load)


RULES: dict[BiasRule, BalancingRule] = {
    BiasRule.threshold: ThresholdRule(), BiasRule.quantile: QuantileRule(),
    BiasRule.sign: SignRule(), BiasRule.none: BalancingRule()}


def balancing_rule(cfg: ModelConfig) -> BalancingRule:
    return RULES[cfg.bias_rule]


def bias_stat(cfg: ModelConfig, logits: jax.Array, mesh=None,
              bias: jax.Array | None = None) -> jax.Array:
    """This call's share of the rule's statistic (under a mesh: threshold's merged over all
    devices and split over "expert" on the E axis; ``bias``: the layer's current bias)."""
    return balancing_rule(cfg).stat(cfg, logits, mesh, bias)


def merge_bias_stat(cfg: ModelConfig, a: jax.Array, b: jax.Array) -> jax.Array:
    """:meth:`BalancingRule.merge` of two statistics (any leading axes, e.g. layers)."""
    return balancing_rule(cfg).merge(a, b)


def bias_target_from_stat(cfg: ModelConfig, stat: jax.Array) -> jax.Array:
    return balancing_rule(cfg).target(cfg, stat)


# The recipe's router statistics (Marin's grug MoE `_routing_stats`, marin-community/marin
# experiments/grug/moe/model.py; issue 22 item 3), per layer over the step's assignments:
# routing entropy = -sum_e f_e log(f_e + 1e-6), f_e = e's share of the assignments (the 1e-6
# guard is theirs); load-balancing loss = E sum_e (k f_e) P_e, P_e the mean softmax probability
# of e (Switch's E sum_e f_e P_e with f the share of *tokens*, k f_e: Fedus et al. 2021 eq. 4).
ENTROPY_GUARD = 1e-6


def load_entropy(load: jax.Array) -> jax.Array:
    """load [..., E] assignment counts -> [...]: the entropy (nats) of the assignment shares."""
    f = load / jnp.maximum(jnp.sum(load, axis=-1, keepdims=True), 1.0)
    return -jnp.sum(f * jnp.log(f + ENTROPY_GUARD), axis=-1)


def balance_loss(load: jax.Array, prob: jax.Array, top_k: int) -> jax.Array:
    """load [..., E] assignment counts, prob [..., E] mean softmax probabilities -> [...]:
    E * sum_e (k f_e) P_e (k when both are uniform: Switch's loss times k)."""
    E = load.shape[-1]
    f = load / jnp.maximum(jnp.sum(load, axis=-1, keepdims=True), 1.0)
    return E * jnp.sum(top_k * f * prob, axis=-1)


def moe_stats(cfg: ModelConfig, logits: jax.Array, routing: Routing, kept: jax.Array,
              stat: jax.Array | None = None, bias: jax.Array | None = None) -> dict:
    """Named statistics of one MoE layer (none differentiated): drop_frac (exact), load [E]
    (assignments per expert before dropping), prob [E] (mean softmax(logits)), router_entropy,
    router_z_loss (mean logsumexp(logits)^2), balance_loss (entropy and balance loss are
    functions of load and prob, which merge exactly: trainer/step.py recomputes them for the
    step), bias_stat (of ``logits`` and ``bias`` when not given) and bias_target [E]."""
    logits = jax.lax.stop_gradient(logits)
    T, E = logits.shape
    A = T * cfg.top_k
    load = jnp.bincount(routing.expert.reshape(A), length=E).astype(jnp.float32)   # [E]
    prob = jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)           # [E]
    lse = jax.nn.logsumexp(logits, axis=-1)                            # [T]
    stat = bias_stat(cfg, logits, bias=bias) if stat is None else stat
    return {
        "drop_frac": (A - jnp.sum(kept)) / A,                           # integer count: exact
        "load": load,
        "prob": prob,
        "router_entropy": load_entropy(load),
        "router_z_loss": jnp.mean(lse ** 2),
        "balance_loss": balance_loss(load, prob, cfg.top_k),
        "bias_stat": stat,
        "bias_target": bias_target_from_stat(cfg, stat),
    }


def update_router_bias(cfg: ModelConfig, router_bias: jax.Array, stats: dict,
                       router_step: jax.Array | None = None) -> jax.Array:
    """The next step's router bias [n_layers, E] from this step's stats by ``cfg.bias_rule``
    (``router_step``: :class:`TargetRule`)."""
    new = balancing_rule(cfg).update(cfg, router_bias, stats, router_step)
    return jax.lax.stop_gradient(jnp.asarray(new, router_bias.dtype))


def empty_bias_stat(cfg: ModelConfig, shape) -> jax.Array:
    """The identity of :func:`merge_bias_stat` (the statistic of no tokens)."""
    return jnp.full(shape, balancing_rule(cfg).empty_fill(), jnp.float32)
