"""Dropless MoE dispatch: the blocked grouped matmul (model.moe.dispatch_dropless) against the
jax.lax.ragged_dot path it replaced, on this machine's XLA backend.

For each number of experts E (tokens, top-k and widths fixed), both paths are compiled and
reported side by side: the matmul FLOPs of the compiled program (ladder.trainer.plan.hlo_flops,
loops x trip counts) over the
ideal 6 x rows x L x F (three matmuls of 2 x L x F per assignment), XLA's
temporary bytes, what the ragged_dot became (its widest dot), and the median forward time, the
paths interleaved round-robin in one process so that load from other processes hits them alike.
Both are checked to agree before timing. ``--blocks`` also times the blocked path at other block
sizes (rows per block; the default rule is ladder.model.moe.group_block).

    python bench/dropless_dispatch.py [--tokens 512] [--top-k 8] [--width 128]
                                      [--experts 8,32,128] [--blocks 16,64] [--reps 5]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ladder.model.moe import dispatch_dropless, group_block  # noqa: E402
from ladder.trainer.plan import _instruction, hlo_flops  # noqa: E402


def ragged_path(x, expert, weights):
    """The replaced path: assignments sorted by expert through jax.lax.ragged_dot."""
    T, k = expert.shape
    E = weights[0].shape[0]
    flat = expert.reshape(T * k)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
    xs = x[order // k]
    h = jax.nn.silu(jax.lax.ragged_dot(xs, weights[0], sizes)) \
        * jax.lax.ragged_dot(xs, weights[1], sizes)
    ys = jax.lax.ragged_dot(h, weights[2], sizes)
    return jnp.zeros_like(ys).at[order].set(ys).reshape(T, k, -1)


def widest_dot(text: str) -> str:
    """The dot with the most FLOPs in compiled HLO text, as 'f32[a,b] x f32[b,c]'."""
    best, most, shapes = "", -1.0, {}
    for line in text.splitlines():
        parsed = _instruction(line)
        if parsed is None:
            continue
        name, shape, opcode, rest = parsed
        shapes[name] = shape
        if opcode == "dot":
            lhs, rhs = (shapes.get(o.strip().lstrip("%"), "?")
                        for o in rest.split(")", 1)[0].split(",")[:2])
            dims = [int(d) for d in re.findall(r"\d+", lhs.split("[", 1)[-1])]
            flops = float(np.prod(dims or [0])) * float(np.prod(
                [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1])] or [0]))
            if flops > most:
                best, most = f"{lhs} x {rhs}", flops
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--width", type=int, default=128, help="latent width L = hidden width F")
    ap.add_argument("--experts", default="8,32,128")
    ap.add_argument("--blocks", default="", help="other block sizes to time (default: none)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    T, k, L = args.tokens, args.top_k, args.width
    rows = T * k
    print(f"# jax {jax.__version__} on {jax.devices()[0].platform}; T={T} k={k} L=F={L}, "
          f"rows {rows}; FLOPs are compiled matmul FLOPs / (6 rows L F)")
    print(f"{'E':>5} {'path':<14} {'FLOPs/ideal':>11} {'temp MiB':>9} {'median ms':>10} "
          f"{'vs blocked':>10}  lowering")
    for E in [int(e) for e in args.experts.split(",")]:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(T, L)), jnp.float32)
        logits = rng.normal(size=(T, E))
        expert = jnp.asarray(np.argsort(-logits, axis=1)[:, :k], jnp.int32)
        w = tuple(jnp.asarray(rng.normal(size=s) / np.sqrt(s[1]), jnp.float32)
                  for s in ((E, L, L), (E, L, L), (E, L, L)))
        paths = {f"blocked b={group_block(rows, E)}": lambda x, e, w: dispatch_dropless(x, e, w)}
        for b in [int(b) for b in args.blocks.split(",") if b]:
            paths[f"blocked b={b}"] = lambda x, e, w, b=b: dispatch_dropless(x, e, w, block=b)
        paths["ragged_dot"] = ragged_path
        compiled, info = {}, {}
        for name, fn in paths.items():
            c = jax.jit(fn).lower(x, expert, w).compile()
            compiled[name] = c
            text = c.as_text()
            info[name] = (hlo_flops(text).flops / (6 * rows * L * L),
                          c.memory_analysis().temp_size_in_bytes / 2**20,
                          f"widest dot {widest_dot(text)}")
        ref = np.asarray(compiled["ragged_dot"](x, expert, w))
        for name, c in compiled.items():
            np.testing.assert_allclose(np.asarray(c(x, expert, w)), ref, rtol=2e-4, atol=2e-4,
                                       err_msg=name)
        times = {name: [] for name in compiled}
        for _ in range(args.reps):   # round-robin: the paths share the machine's load alike
            for name, c in compiled.items():
                t = time.perf_counter()
                jax.block_until_ready(c(x, expert, w))
                times[name].append(time.perf_counter() - t)
        base = statistics.median(times[next(iter(compiled))])
        for name in compiled:
            med = statistics.median(times[name])
            ratio, temp, lowering = info[name]
            print(f"{E:>5} {name:<14} {ratio:>11.2f} {temp:>9.1f} {med * 1e3:>10.1f} "
                  f"{med / base:>10.2f}  {lowering}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
