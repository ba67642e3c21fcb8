"""MoE dispatch: sort-based (model.moe.dispatch_sorted) vs one-hot einsum vs jax.lax.ragged_dot.

Variants: ``sorted`` (the model's: sort assignments by expert, scatter into [E, C, L], batched
expert einsum, gather back); ``onehot_einsum`` (GShard/Switch style: an [A, E, C] one-hot dispatch
tensor contracted by einsum, cost growing with T x C); ``dense_masked`` (every expert on every
token, outputs picked by a [T, k, E] one-hot mask); ``ragged_dot`` (sorted assignments through
jax.lax.ragged_dot, no capacity buffer).

Times one training step of the routed-expert path (dispatch, SwiGLU experts, combine; forward and
backward) at a cpu-ladder size, the three variants interleaved round-robin in one process so
that load from other processes hits them alike; prints median times and ratios to sort-based.
All three use the same capacity semantics (earlier tokens win slots) and are checked to agree
before timing.

    python bench/moe_dispatch.py [--tokens 2048] [--d 64] [--experts 8] [--top-k 2] [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from ladder.model.config import ModelConfig
from ladder.model.moe import capacity, dispatch_sorted, route, swiglu


def experts_fn(w):
    """[E, C, L] -> [E, C, L] with the routed-expert weights w."""
    return lambda buf: swiglu(buf, w["gate"], w["up"], w["down"], "ecl,elf->ecf", "ecf,efl->ecl")


def sorted_path(w, x, expert, n_experts, cap):
    out, _ = dispatch_sorted(experts_fn(w), x, expert, n_experts, cap)
    return out                                                   # [T, k, L]


def onehot_path(w, x, expert, n_experts, cap):
    """Dispatch and combine as einsums with an [A, E, C] one-hot tensor (GShard / Switch style)."""
    T, k = expert.shape
    flat = expert.reshape(T * k)                                 # [A]
    onehot = jax.nn.one_hot(flat, n_experts, dtype=x.dtype)      # [A, E]
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1).astype(jnp.int32)  # [A]
    kept = (slot < cap).astype(x.dtype)
    dispatch = onehot[:, :, None] * jax.nn.one_hot(slot, cap, dtype=x.dtype)[:, None, :] \
        * kept[:, None, None]                                    # [A, E, C]
    tokens = jnp.repeat(x, k, axis=0)                            # [A, L], a = t*k + j
    buf = jnp.einsum("aec,al->ecl", dispatch, tokens)            # [E, C, L]
    out = experts_fn(w)(buf)
    return jnp.einsum("aec,ecl->al", dispatch, out).reshape(T, k, -1)


def dense_path(w, x, expert, n_experts, cap):
    """No dispatch at all: every expert runs on every token (E/k times the needed expert FLOPs),
    and a one-hot mask [T, k] x [E] picks each assignment's output; same drops as the others."""
    T = expert.shape[0]
    _, kept = dispatch_slots(expert, n_experts, cap)
    out = experts_fn(w)(jnp.broadcast_to(x[None], (n_experts, T, x.shape[-1])))   # [E, T, L]
    onehot = jax.nn.one_hot(expert, n_experts, dtype=x.dtype) * kept[..., None]   # [T, k, E]
    return jnp.einsum("tje,etl->tjl", onehot, out)


def dispatch_slots(expert, n_experts, cap):
    """(slot [T, k], kept [T, k]): each assignment's position within its expert, in token order."""
    T, k = expert.shape
    onehot = jax.nn.one_hot(expert.reshape(T * k), n_experts, dtype=jnp.int32)    # [A, E]
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1).reshape(T, k)
    return slot, slot < cap


def ragged_path(w, x, expert, n_experts, cap):
    """Assignments sorted by expert, experts applied with jax.lax.ragged_dot (no buffer);
    assignments past the capacity are zeroed afterwards, as in the capacity-limited variants."""
    T, k = expert.shape
    A = T * k
    flat = expert.reshape(A)
    order = jnp.argsort(flat, stable=True)
    counts = jnp.bincount(flat, length=n_experts).astype(jnp.int32)
    starts = jnp.cumsum(counts) - counts
    kept = (jnp.arange(A) - starts[flat[order]]) < cap           # [A] in sorted order
    xs = x[order // k]                                           # [A, L]
    gate = jax.lax.ragged_dot(xs, w["gate"], counts)             # [A, F]
    h = jax.nn.silu(gate) * jax.lax.ragged_dot(xs, w["up"], counts)
    ys = jax.lax.ragged_dot(h, w["down"], counts) * kept[:, None]
    return jnp.zeros_like(ys).at[order].set(ys).reshape(T, k, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step (cpu: 16 x 128)")
    ap.add_argument("--d", type=int, default=64, help="model width; latent = expert width = d/2")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()

    cfg = ModelConfig(vocab_size=256, d_model=args.d, n_layers=1, n_heads=1, head_dim=args.d,
                      n_kv_heads_local=1, n_kv_heads_global=1, n_experts=args.experts,
                      top_k=args.top_k, expert_dim=args.d // 2, latent_dim=args.d // 2,
                      capacity_factor=args.capacity_factor)
    E, L, F, T = cfg.n_experts, cfg.latent_dim, cfg.expert_dim, args.tokens
    rng = np.random.default_rng(0)
    w = {"gate": rng.normal(0, L ** -0.5, (E, L, F)), "up": rng.normal(0, L ** -0.5, (E, L, F)),
         "down": rng.normal(0, F ** -0.5, (E, F, L))}
    w = {k: jnp.asarray(v, jnp.float32) for k, v in w.items()}
    x = jnp.asarray(rng.normal(size=(T, L)), jnp.float32)
    logits = jnp.asarray(rng.normal(size=(T, E)) + np.linspace(0.5, -0.5, E), jnp.float32)
    r = route(cfg, logits, jnp.zeros(E))
    cap = capacity(cfg, T)

    def step(path):
        def loss(w, x, weight):
            out = path(w, x, r.expert, E, cap)                   # [T, k, L]
            return jnp.sum(jnp.einsum("tjl,tj->tl", out, weight) ** 2)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    paths = {"sorted": sorted_path, "onehot_einsum": onehot_path, "dense_masked": dense_path,
             "ragged_dot": ragged_path}
    steps, results = {}, {}
    for name, path in paths.items():
        try:
            steps[name] = step(path)
            results[name] = jax.block_until_ready(steps[name](w, x, r.weight))
        except Exception as e:  # noqa: BLE001  (ragged_dot may not lower on every backend)
            print(f"{name}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            steps.pop(name, None)
    ref_val, ref_grads = results["sorted"]
    for val, grads in results.values():
        np.testing.assert_allclose(val, ref_val, rtol=1e-4)
        for g, g_ref in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
            np.testing.assert_allclose(g, g_ref, rtol=1e-3, atol=1e-5 * float(jnp.abs(g_ref).max()))

    times = {name: [] for name in steps}
    for _ in range(args.reps):                                   # interleaved round-robin
        for name, f in steps.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(w, x, r.weight))
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    drop = 1 - float(jnp.mean(dispatch_sorted(experts_fn(w), x, r.expert, E, cap)[1]))
    print(f"MoE expert path, fwd+bwd: T={T} tokens, E={E}, top-{cfg.top_k}, latent {L}, hidden "
          f"{F}, capacity {cap} (cf {cfg.capacity_factor}, {drop:.1%} dropped), "
          f"{args.reps} interleaved reps, backend {jax.default_backend()}")
    print(f"{'variant':<15} {'median ms':>10} {'x sorted':>9}")
    for name in steps:
        print(f"{name:<15} {1e3 * med[name]:>10.3f} {med[name] / med['sorted']:>9.2f}")


if __name__ == "__main__":
    main()
