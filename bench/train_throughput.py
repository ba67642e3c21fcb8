"""Training throughput: MoE vs dense at equal active parameters, and achieved FLOP/s vs a matmul.

    python bench/train_throughput.py [--d 64 128 256] [--layers 2] [--batch 16] [--reps 5]

For each width d this times the trainer's own jitted step (forward, backward, AdamW update,
router-bias rule: ``ladder.trainer.step.programs``) on the CPU recipe's model, and in the
same run a 2048 x 2048 float32 matmul. Everything is measured interleaved (MoE, dense, matmul,
MoE, ...) and the medians compared, so the ratios stay meaningful on a machine shared with other
jobs; the absolute numbers do not.

The dense baseline is the same model with ``n_experts = top_k`` (every token goes to every
expert; nothing is routed away or dropped). It has the same attention, latent projections and
shared expert, the same active parameters (up to the router's d x E weights, which flops-v1
counts) and the same code, so MoE/dense isolates the price of sparse routing: top-k among E,
capacity dispatch and combine. A separate SwiGLU MLP would also change the latent projections
and the code path, mixing that price with unrelated differences.

Achieved FLOP/s counts training FLOPs with flops-v1 (ladder/counting.py, LM head included,
since the step computes it) and divides by the measured step time. Targets (issue #3):
MoE/dense step time <= 1.15; at d = 256 at least 30% of the matmul's FLOP/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from ladder.specs import LADDERS
from ladder.trainer.data import stdlib_corpus
from ladder.trainer.step import enable_compilation_cache, make_mesh, programs

CPU_RECIPE = LADDERS["cpu"].recipe


def step_timer(model_cfg, batch: int, seq_len: int):
    """A closure running one training step of ``model_cfg``; returns its wall time (s)."""
    progs = programs(model_cfg, make_mesh(1, 1, model_cfg.n_experts, batch))
    state = progs.init_state(0)
    corpus = stdlib_corpus()
    batches = [jax.device_put({**corpus.batch(0, i, batch, seq_len), "lr": np.float32(1e-3)})
               for i in range(4)]
    compiled = progs.compiled_step(state, batches[0])
    holder = {"state": state, "i": 0}

    def run() -> float:
        b = batches[holder["i"] % len(batches)]
        holder["i"] += 1
        t = time.perf_counter()
        holder["state"], m = compiled(holder["state"], b)
        jax.block_until_ready(m)
        return time.perf_counter() - t

    run()  # warm-up
    return run


def matmul_timer(n: int = 2048):
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()

    def run() -> float:
        t = time.perf_counter()
        mm(a).block_until_ready()
        return time.perf_counter() - t
    return run, 2.0 * n ** 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=CPU_RECIPE.batch_per_unit)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    enable_compilation_cache()
    seq = CPU_RECIPE.seq_len
    mm, mm_flops = matmul_timer()
    print(f"# jax {jax.__version__} on {jax.devices()[0].device_kind} x{len(jax.devices())}; "
          f"seq {seq}, batch {args.batch}, {args.layers} layers, medians of {args.reps} "
          f"interleaved reps", flush=True)
    print(f"{'d':>4} {'experts':>8} {'active':>8} {'moe ms':>8} {'dense ms':>9} {'moe/dense':>9} "
          f"{'moe GF/s':>9} {'dense GF/s':>10} {'mm GF/s':>8} {'moe/peak':>8} {'dense/peak':>10}")
    results = []
    from ladder.counting import count_params, flops_per_token
    for d in args.d:
        moe_cfg = CPU_RECIPE.model(d, args.layers)
        dense_cfg = moe_cfg.replace(n_experts=moe_cfg.top_k)
        timers = {"moe": step_timer(moe_cfg, args.batch, seq),
                  "dense": step_timer(dense_cfg, args.batch, seq), "mm": mm}
        times = {k: [] for k in timers}
        for _ in range(args.reps):
            for k, run in timers.items():
                times[k].append(run())
        med = {k: statistics.median(v) for k, v in times.items()}
        tokens = args.batch * seq
        fl = {k: flops_per_token(c, seq).training(tokens, lm_head=True)
              for k, c in (("moe", moe_cfg), ("dense", dense_cfg))}
        peak = mm_flops / med["mm"]
        row = {"d": d, "n_experts": moe_cfg.n_experts, "top_k": moe_cfg.top_k,
               "active_params_moe": count_params(moe_cfg).active,
               "active_params_dense": count_params(dense_cfg).active,
               "moe_step_s": med["moe"], "dense_step_s": med["dense"],
               "moe_over_dense": med["moe"] / med["dense"],
               "moe_flops_per_s": fl["moe"] / med["moe"],
               "dense_flops_per_s": fl["dense"] / med["dense"], "matmul_flops_per_s": peak,
               "moe_frac_of_peak": fl["moe"] / med["moe"] / peak,
               "dense_frac_of_peak": fl["dense"] / med["dense"] / peak,
               "tokens_per_s_moe": tokens / med["moe"], "tokens_per_s_dense": tokens / med["dense"]}
        results.append(row)
        print(f"{d:>4} {moe_cfg.n_experts:>4}/{moe_cfg.top_k:<3} {row['active_params_moe']:>8,} "
              f"{med['moe'] * 1e3:>8.1f} {med['dense'] * 1e3:>9.1f} {row['moe_over_dense']:>9.2f} "
              f"{row['moe_flops_per_s'] / 1e9:>9.2f} {row['dense_flops_per_s'] / 1e9:>10.2f} "
              f"{peak / 1e9:>8.1f} {row['moe_frac_of_peak']:>8.1%} "
              f"{row['dense_frac_of_peak']:>10.1%}", flush=True)
    print("targets: moe/dense <= 1.15; at d=256 moe/peak >= 30%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
