"""Router-bias balancing rules on a fixed synthetic router: expert-load CV per step, side by side.

The router (issue 12's simulation size: E=128 experts, top-8, T=16,384 tokens per step): tokens
fall into 32 clusters with Zipf(1) sizes; each cluster raises the logits of 16 experts by 2.0, so
more experts than a token's 8 slots compete for the popular clusters' tokens; a fixed skew
(-0.5 .. 0.5 over experts) and fixed per-token noise (sd 0.3), plus fresh noise (sd 0.3) every
step. Each step routes with the bias from the previous step's statistics (the trainer's order:
the pending update applies before the next step) and records std(load) / mean(load).

Rules (computed directly by tests/helpers.py): ``threshold`` (model/moe.py, today's default: minus
each expert's n-th largest raw logit), ``quantile`` (model/balance.py, the hero recipe's). Issue
12 quotes 0.10-0.27 for the former and 0.04 for the latter in the recipe authors' own simulation.

    python bench/balance.py [--steps 30] [--experts 128] [--top-k 8] [--tokens 16384]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, for tests.helpers
from tests.helpers import quantile_bias, threshold_bias  # noqa: E402  (the rules, computed directly)

RULES = ("threshold", "quantile")


def synthetic_router(n_experts: int = 128, n_tokens: int = 16_384, seed: int = 0,
                     clusters: int = 32, per_cluster: int = 16, boost: float = 2.0):
    """The fixed part of the logits [T, E] (float32) described in the module docstring."""
    rng = np.random.default_rng(seed)
    sizes = 1.0 / np.arange(1, clusters + 1)
    cluster = rng.choice(clusters, size=n_tokens, p=sizes / sizes.sum())
    affinity = np.zeros((clusters, n_experts), np.float32)
    for c in range(clusters):
        affinity[c, rng.choice(n_experts, size=min(per_cluster, n_experts), replace=False)] = boost
    skew = np.linspace(-0.5, 0.5, n_experts, dtype=np.float32)
    noise = 0.3 * rng.standard_normal((n_tokens, n_experts)).astype(np.float32)
    return jnp.asarray(affinity[cluster] + skew[None, :] + noise)


def load_cvs(rule: str, base: jax.Array, top_k: int, steps: int, noise: float = 0.3,
             seed: int = 1) -> list[float]:
    """Load CV at each of ``steps`` steps under ``rule``, starting from a zero bias."""
    T, E = base.shape

    @jax.jit
    def step(bias, key):
        logits = base + noise * jax.random.normal(key, (T, E))
        _, chosen = jax.lax.top_k(logits + bias[None, :], top_k)            # [T, k]
        load = jnp.bincount(chosen.reshape(-1), length=E).astype(jnp.float32)
        new = (threshold_bias(logits, top_k) if rule == "threshold"
               else quantile_bias(logits, bias, top_k))
        return new, jnp.std(load) / jnp.mean(load)

    bias, cvs = jnp.zeros((E,), jnp.float32), []
    for i in range(steps):
        bias, cv = step(bias, jax.random.fold_in(jax.random.key(seed), i))
        cvs.append(float(cv))
    return cvs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="steps per rule (default: 30)")
    ap.add_argument("--experts", type=int, default=128, help="routed experts (default: 128)")
    ap.add_argument("--top-k", type=int, default=8, help="experts per token (default: 8)")
    ap.add_argument("--tokens", type=int, default=16_384, help="tokens per step (default: 16384)")
    args = ap.parse_args(argv)
    base = synthetic_router(args.experts, args.tokens)
    floor = np.sqrt((1 - args.top_k / args.experts) / (args.tokens * args.top_k / args.experts))
    print(f"E={args.experts} k={args.top_k} T={args.tokens}; binomial CV floor of independent "
          f"routing {floor:.3f}")
    print(f"{'rule':<10} {'CV step 1':>9} {'step 2':>7} {'step 5':>7} {'step 10':>7} "
          f"{'last 10 mean':>12} {'max':>6} {'s/step':>7}")
    for rule in RULES:
        t = time.perf_counter()
        cvs = load_cvs(rule, base, args.top_k, args.steps)
        dt = (time.perf_counter() - t) / args.steps
        tail = cvs[-10:]
        print(f"{rule:<10} {cvs[0]:>9.3f} {cvs[1]:>7.3f} {cvs[4]:>7.3f} {cvs[9]:>7.3f} "
              f"{np.mean(tail):>12.3f} {max(tail):>6.3f} {dt:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
