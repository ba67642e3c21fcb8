"""Train N steps of real rung shapes on whatever accelerators are visible; print tokens/s, MFU
and peak memory.

    python bench/gpu_rung.py                      # 1.6B-A61M full depth + 27.7B-A1.2B at 2 layers
    python bench/gpu_rung.py --rung 1.6B-A61M --batch 8 --steps 20
    python bench/gpu_rung.py --smoke              # tiny shapes on CPU, seconds (a test runs it)

Each configuration is the trainer's own step (``ladder.train.programs``: forward, backward,
AdamW, router-bias rule, expert-parallel MoE over a mesh of all visible devices, microbatches
when ``--microbatch`` is given) on random tokens of the rung's vocabulary at its sequence length.
Configurations (the real ladder's shapes, shared/DESIGN.md):

- ``1.6B-A61M``: d 768, 8 layers, 384 experts top-8, seq 4096, vocab 128,256; the batch is the
  largest power of two that ``ladder plan``'s estimate fits in 80% of one device's memory x the
  device count (``--batch`` overrides), never the rung's full 1024 sequences on one GPU;
- ``27.7B-A1.2B``: its widths (d 2048, 16 heads, 384 experts) at ``--layers`` layers (default 2:
  one local and one global), so it fits one GPU.

The first step (compilation) is timed apart; tokens/s and MFU are medians over the remaining
steps. MFU = flops-v1 training FLOPs per token (LM head included) x tokens/s / (devices x the
device's dense bf16 peak from ladder/plan.py's table; CPU: a measured matmul). Peak memory is
the device allocator's ``peak_bytes_in_use`` where the backend reports it (GPU/TPU), else XLA's
memory analysis of the compiled step (arguments + temporaries + outputs not aliased).

Nothing is asserted: the figures go in the closing note of whoever runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ladder.plan import plan_rung  # noqa: E402
from ladder.specs import LADDERS  # noqa: E402
from ladder.step import batch_sharding, enable_compilation_cache, make_mesh, programs  # noqa: E402
from ladder.train import peak_flops_info  # noqa: E402


def rung_config(name: str, layers: int | None, smoke: bool):
    """The rung to time: a real rung (reduced to ``layers`` when given), or tiny shapes."""
    if smoke:
        return LADDERS["tiny"].rungs[0]
    rung = LADDERS["marin-535b"].get(name)
    if layers is not None and layers != rung.model.n_layers:
        rung = rung.replace(name=f"{name}@{layers}L", model=rung.model.replace(n_layers=layers))
    return rung


def default_batch(rung, devices: int) -> int:
    """Largest power-of-two batch (>= devices) whose planned memory fits 80% of a device."""
    stats = jax.devices()[0].memory_stats() or {}
    limit = 0.8 * stats.get("bytes_limit", 16e9)
    b = devices
    while b * 2 <= rung.batch and plan_rung(rung.replace(batch=b * 2),
                                            devices).total_bytes <= limit:
        b *= 2
    return b


def peak_memory(compiled) -> tuple[float, str]:
    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    if all("peak_bytes_in_use" in s for s in stats):
        return float(max(s["peak_bytes_in_use"] for s in stats)), "allocator peak_bytes_in_use"
    m = compiled.memory_analysis()
    return (float(m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
                  - m.alias_size_in_bytes), "XLA memory analysis of the step")


def time_rung(rung, *, batch: int, steps: int, microbatch: int | None, seed: int = 0) -> dict:
    rung = rung.replace(batch=batch)
    mb = microbatch or batch
    mesh = make_mesh(None, None, rung.model.n_experts, mb)
    n = int(mesh.devices.size)
    progs = programs(rung.model, mesh, rung.optimizer_settings, batch // mb)
    state = progs.init_state(seed)
    rng = np.random.default_rng(seed)
    split = batch_sharding(mesh)

    def make_batch():
        toks = rng.integers(0, rung.model.vocab_size, (batch, rung.seq_len + 1), dtype=np.int32)
        return {"tokens": jax.device_put(toks[:, :-1], split),
                "targets": jax.device_put(toks[:, 1:], split), "lr": jnp.float32(1e-4)}

    b = make_batch()
    t = time.perf_counter()
    compiled = progs.compiled_step(state, b)
    state, m = compiled(state, b)
    jax.block_until_ready(m)
    first = time.perf_counter() - t
    times, losses = [], []
    for _ in range(steps):
        b = make_batch()
        jax.block_until_ready(b)
        t = time.perf_counter()
        state, m = compiled(state, b)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
        losses.append(float(m["train/loss"]))
    step_s = statistics.median(times)
    tokens = batch * rung.seq_len
    peak = peak_flops_info(None, n)
    flops_per_token = rung.flops.training(1, lm_head=True)
    mem, mem_source = peak_memory(compiled)
    return {"rung": rung.name, "d_model": rung.model.d_model, "layers": rung.model.n_layers,
            "experts": rung.model.n_experts, "seq_len": rung.seq_len, "batch": batch,
            "microbatch": mb, "devices": n, "mesh": dict(mesh.shape),
            "device_kind": jax.devices()[0].device_kind, "first_step_s": first,
            "step_s": step_s, "tokens_per_s": tokens / step_s,
            "mfu": tokens / step_s * flops_per_token / peak["total_flops_per_s"],
            "peak": peak, "peak_memory_bytes": mem, "peak_memory_source": mem_source,
            "loss_first": losses[0], "loss_last": losses[-1], "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rung", action="append", default=None,
                    help="rung name of marin-535b (default: 1.6B-A61M and 27.7B-A1.2B)")
    ap.add_argument("--layers", type=int, default=None,
                    help="layers of 27.7B-A1.2B (default: 2) or of every --rung given")
    ap.add_argument("--batch", type=int, default=None,
                    help="sequences per step (default: the largest power of two that fits)")
    ap.add_argument("--microbatch", type=int, default=None,
                    help="sequences per microbatch (default: the whole batch)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps after the first (10)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on CPU for a few steps (default: off)")
    ap.add_argument("--json", default=None, help="also write the results here (default: none)")
    args = ap.parse_args(argv)
    enable_compilation_cache()
    if args.smoke:
        plan = [("tiny", None)]
    elif args.rung:
        plan = [(r, args.layers) for r in args.rung]
    else:
        plan = [("1.6B-A61M", None), ("27.7B-A1.2B", args.layers or 2)]
    print(f"# jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].device_kind}",
          flush=True)
    print(f"{'rung':<16} {'batch':>5} {'mb':>4} {'mesh':>6} {'compile+1 s':>11} {'step s':>8} "
          f"{'tokens/s':>10} {'MFU':>7} {'peak mem':>10}", flush=True)
    results = []
    for name, layers in plan:
        rung = rung_config(name, layers, args.smoke)
        n = jax.device_count()
        batch = args.batch or (2 * n if args.smoke else default_batch(rung, n))
        row = time_rung(rung, batch=batch, steps=2 if args.smoke else args.steps,
                        microbatch=args.microbatch)
        results.append(row)
        mesh = f"{row['mesh']['data']}x{row['mesh']['expert']}"
        print(f"{row['rung']:<16} {row['batch']:>5} {row['microbatch']:>4} {mesh:>6} "
              f"{row['first_step_s']:>11.1f} {row['step_s']:>8.3f} {row['tokens_per_s']:>10.0f} "
              f"{row['mfu']:>7.2%} {row['peak_memory_bytes'] / 2**30:>8.2f}Gi", flush=True)
    print(f"MFU against {results[0]['peak']['source']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
