"""Drop fraction against the capacity cell (issue 22 item 2).

Capacity is counted per (cell, expert): each expert takes ceil(cf x cell tokens x k / E)
assignments of a cell of ``model.capacity_tokens`` consecutive tokens. The smaller the cell, the
larger its relative load fluctuations and the more it drops. This trains one cpu-ladder rung with
the recipe's routing (the marin optimizer and init, the quantile balancing rule, capacity factor
1.15; its own cells, ``capacity_tokens`` in ladder/ladders/cpu.toml) and then evaluates the
trained model's held-out drop fraction (``moe/drop_frac``, every layer's assignments, with the
drops of earlier layers in place) with cells of 1, 2, 4, ... sequences, one cell per call.

What a cell means depends on E and k: the expected assignments per (cell, expert) are
cell x k / E. The table gives, for each toy cell, the 1.6B-A61M cell with the same expected load
per (cell, expert) (k = 8 of E = 384 there: x 12 the toy's tokens for the toy's k = 2 of E = 8).
That is a proxy, not a measurement of the 1.6B model: a trained router's clustering decides the
drops as much as the load does.

    nice python bench/capacity_cell.py [--out runs_capacity_cell] [--rung -1] [--json FILE]

``--layout`` measures instead what the cell is for: one tiny rung (batch 16, drops on at capacity
factor 1.25) trained on 1 device, on 1 device in 4 microbatches, on 8 fake CPU devices (2 data x
4 expert) and on 8 in 2 microbatches, by this checkout and by another commit (``--baseline``,
default main; exported with ``git archive``, so a dirty /work/main is never read), each in its
own process with 8 host devices. It prints each layout's largest per-step loss difference from
1 device, and the median step time on 8 devices of this checkout over the baseline's, the two
trees' processes alternating round by round so that load from other processes hits both alike.

    nice python bench/capacity_cell.py --layout [--baseline main] [--rounds 3] [--steps 20]

``--dispatch`` times the routed path alone in one process (fwd + bwd, one device), main's rule
(one cell of the whole call, earlier tokens first) against cells with drop keys, interleaved:

    nice python bench/capacity_cell.py --dispatch [--tokens 4096] [--cell 128] [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy

# the recipe's routing and optimizer as ladder-file recipe keys (ladder/ladders/marin-535b.toml)
RECIPE = {"bias_rule": "quantile", "capacity_factor": 1.15, "optimizer": {"kind": "marin"},
          "init": "recipe"}
REAL = {"name": "1.6B-A61M", "experts": 384, "top_k": 8}


def recipe_ladder():
    from ladder.specs import parse_ladder

    obj = tomllib.loads((ROOT / "ladder" / "ladders" / "cpu.toml").read_text())
    obj["recipe"] = {**obj["recipe"], **RECIPE}
    obj["name"] = "cpu-recipe-routing"
    return parse_ladder(obj)


def trained_state(rung, run_dir: Path):
    """(params, router_bias) of ``rung`` trained to its end in ``run_dir`` (reused if done)."""
    from ladder.trainer.checkpointing import Checkpoints
    from ladder.trainer.step import make_mesh, programs
    from ladder.trainer.train import train_rung
    from ladder.trainer.trainconfig import RunArgs, TrainConfig, resolve_rung

    cfg = TrainConfig(run=RunArgs(progress=False))
    summary = train_rung(rung, run_dir, cfg, resume=True)
    if summary.get("status") != "complete":
        raise RuntimeError(f"{rung.name} ended {summary.get('status')}; see {run_dir}")
    rung = resolve_rung(rung, cfg)
    progs = programs(rung.model, make_mesh(1, 1, rung.model.n_experts, rung.batch),
                     rung.optimizer_settings)
    ck = Checkpoints(run_dir / "checkpoints", keep=2)
    try:
        state = ck.restore(ck.latest_step(), progs.init_state(0))
    finally:
        ck.close()
    return rung, state["params"], state["router_bias"]


def drop_fraction(cfg, params, bias, cell_seqs: int, seq_len: int, sequences: int) -> float:
    """Held-out drop fraction with cells of ``cell_seqs`` sequences, one cell per call, over
    ``sequences`` sequences of the default data's validation stream."""
    import jax
    import numpy as np

    import ladder.model as M
    from ladder.trainer.data import stdlib_corpus

    cfg = cfg.replace(capacity_tokens=cell_seqs * seq_len)
    step = jax.jit(lambda p, b, t, y: M.loss_fn(cfg, p, b, t, y)[1]["moe/drop_frac"])
    n = max(1, sequences // cell_seqs)
    batches = stdlib_corpus().eval_batches(n, cell_seqs, seq_len)
    return float(np.mean([float(step(params, bias, b["tokens"], b["targets"]))
                          for b in batches]))


# ------------------------------------------------------------------ --layout (issue 22 item 2)
# (devices, expert_parallel, microbatch) of each layout; the first is the reference
LAYOUTS = ((1, 1, None), (1, 1, 4), (8, 4, None), (8, 4, 8))

# Runs in a fresh process (XLA_FLAGS must be set before JAX starts) with PYTHONPATH at one tree;
# only API that main and this branch share (the same as tests/test_train_sharding.py).
WORKER = r"""
import json, statistics, sys, tempfile
from ladder import model
from ladder.io import read_metrics
from ladder.specs import LADDERS
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import RunArgs, TrainConfig
import jax
assert len(jax.devices()) == 8, jax.devices()
steps, layouts = int(sys.argv[1]), json.loads(sys.argv[2])
rung = LADDERS["tiny"].rungs[0].replace(batch=16, steps=steps)
out = {"model": model.__file__, "capacity_tokens": getattr(rung.model, "capacity_tokens", None),
       "capacity_factor": rung.model.capacity_factor}
with tempfile.TemporaryDirectory() as tmp:
    for n, ep, mb in layouts:
        d = f"{tmp}/{n}-{ep}-{mb}"
        train_rung(rung, d, TrainConfig(microbatch=mb, run=RunArgs(
            devices=n, expert_parallel=ep, peak_flops=1e11, progress=False)))
        rows = read_metrics(f"{d}/metrics.jsonl")
        dt = [rung.tokens_per_step / r["throughput/tokens_per_s"] for r in rows]
        out[f"{n}-{ep}-{mb}"] = {"loss": [r["train/loss"] for r in rows],
                                 "drop": [r["moe/drop_frac"] for r in rows],
                                 "step_s": statistics.median(dt[2:])}   # past the compile
print(json.dumps(out))
"""


def export_tree(ref: str, dest: Path) -> str:
    """``ref`` of this repository exported into ``dest`` (git archive: committed files only);
    its commit hash."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return commit


def run_worker(tree: Path, steps: int) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", WORKER, str(steps), json.dumps(LAYOUTS)],
                       cwd=tree, env=env, capture_output=True, text=True, check=False)
    if r.returncode:
        raise RuntimeError(f"worker in {tree} failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not out["model"].startswith(str(tree)):     # the tree's packages, not an installed copy
        raise RuntimeError(f"worker in {tree} imported {out['model']}")
    return out


def layout_main(args) -> int:
    names = [f"{n}-{ep}-{mb}" for n, ep, mb in LAYOUTS]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        commit = export_tree(args.baseline, base)
        trees = {f"baseline {args.baseline} {commit[:10]}": base, "this checkout": ROOT}
        runs = {label: [] for label in trees}
        for i in range(args.rounds):
            for label, tree in trees.items():
                t0 = time.time()
                runs[label].append(run_worker(tree, args.steps))
                print(f"round {i + 1}/{args.rounds} {label}: {time.time() - t0:.0f} s",
                      flush=True)
    print(f"tiny rung 0, batch 16, {args.steps} steps, float32; layouts devices-ep-microbatch")
    rows = {}
    for label, rs in runs.items():
        first = rs[0]
        for r in rs[1:]:                               # a tree gives the same losses every round
            for name in names:
                if r[name]["loss"] != first[name]["loss"]:
                    print(f"  note: {label} {name}: losses differ between rounds")
        ref = first[names[0]]["loss"]
        diffs = {name: max(abs(a - b) for a, b in zip(ref, first[name]["loss"], strict=True))
                 for name in names[1:]}
        step_s = {name: statistics.median(r[name]["step_s"] for r in rs) for name in names}
        rows[label] = {"capacity_tokens": first["capacity_tokens"], "max_abs_loss_diff": diffs,
                       "median_step_s": step_s,
                       "mean_drop_frac": statistics.mean(first[names[0]]["drop"])}
        print(f"{label} (capacity_tokens {first['capacity_tokens']}, capacity factor "
              f"{first['capacity_factor']}, mean drop {rows[label]['mean_drop_frac']:.2%} on "
              f"1 device):")
        for name in names[1:]:
            print(f"  {name:>10}: max |loss - loss(1 device)| over the steps {diffs[name]:.2e}")
        print("  median step s: " + ", ".join(f"{n} {step_s[n]:.3f}" for n in names))
    (b, t) = rows.values()
    for name in names[2:]:
        print(f"step time {name}, this checkout / baseline: "
              f"{t['median_step_s'][name] / b['median_step_s'][name]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": args.steps, "rounds": args.rounds,
                                               "baseline": commit, "rows": rows}, indent=1))
    return 0


def dispatch_main(args) -> int:
    """The routed path alone (dispatch, experts, combine; forward and backward, one device):
    main's rule (one cell of all T tokens, earlier tokens first) against cells of
    ``--cell`` tokens with the per-step drop keys, interleaved round-robin in one process."""
    import jax
    import jax.numpy as jnp

    from ladder.model.moe import capacity, dispatch_sorted, drop_keys, swiglu
    from ladder.specs import LADDERS

    T, L, F, E, k, cell = args.tokens, 64, 64, 8, 2, args.cell
    cfg = LADDERS["tiny"].rungs[0].model.replace(n_experts=E, top_k=k)
    ks = jax.random.split(jax.random.key(0), 5)
    w = [jax.random.normal(ks[i], s) * 0.1 for i, s in enumerate(((E, L, F), (E, L, F),
                                                                   (E, F, L)))]
    x = jax.random.normal(ks[3], (T, L))
    expert = jax.lax.top_k(jax.random.normal(ks[4], (T, E)), k)[1]

    def run(old):
        def f(w, x):
            fn = lambda buf: swiglu(buf, *w, "ecl,elf->ecf", "ecf,efl->ecl")   # noqa: E731
            if old:
                out, _ = dispatch_sorted(fn, x, expert, E, capacity(cfg, T))
            else:
                out, _ = dispatch_sorted(fn, x, expert, E, capacity(cfg, cell),
                                         drop_keys(7, T, k, cell, 64), T // cell)
            return jnp.sum(out ** 2)
        g = jax.jit(jax.grad(f, argnums=(0, 1)))
        return lambda: jax.block_until_ready(g(w, x))

    fns = {"main (one cell, by position)": run(True), f"cells of {cell}, drop keys": run(False)}
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()                                                   # compile
    for _ in range(args.reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(v) for name, v in times.items()}
    base = next(iter(med.values()))
    print(f"routed path fwd+bwd, T={T}, E={E}, k={k}, L=F={L}, {args.reps} interleaved reps")
    for name, m in med.items():
        print(f"  {name:>30}: median {m * 1e3:.2f} ms, x{m / base:.2f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs_capacity_cell", help="runs directory")
    ap.add_argument("--rung", type=int, default=-1, help="which cpu rung (default: the largest)")
    ap.add_argument("--sequences", type=int, default=512,
                    help="held-out sequences per cell size (default: 512)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--layout", action="store_true",
                    help="1 vs 8 devices vs microbatch, this checkout against --baseline")
    ap.add_argument("--baseline", default="main", help="--layout: the commit to compare with")
    ap.add_argument("--rounds", type=int, default=3, help="--layout: alternating rounds")
    ap.add_argument("--steps", type=int, default=20, help="--layout: steps per run")
    ap.add_argument("--dispatch", action="store_true",
                    help="the routed path alone: main's rule against cells with drop keys")
    ap.add_argument("--tokens", type=int, default=4096, help="--dispatch: tokens per call")
    ap.add_argument("--cell", type=int, default=128, help="--dispatch: tokens per cell")
    ap.add_argument("--reps", type=int, default=30, help="--dispatch: timed repetitions")
    args = ap.parse_args(argv)
    if args.dispatch:
        return dispatch_main(args)
    if args.layout:
        return layout_main(args)
    ladder = recipe_ladder()
    rung = ladder.rungs[args.rung]
    t0 = time.time()
    rung, params, bias = trained_state(rung, Path(args.out) / ladder.name / rung.name)
    cfg, seq = rung.model, rung.seq_len
    print(f"{ladder.name}:{rung.name} trained {rung.steps} steps ({time.time() - t0:.0f} s); "
          f"E={cfg.n_experts}, k={cfg.top_k}, capacity factor {cfg.capacity_factor}, "
          f"seq {seq}, trained with cells of {cfg.capacity_tokens} tokens", flush=True)
    scale = (REAL["experts"] / REAL["top_k"]) / (cfg.n_experts / cfg.top_k)
    rows = []
    print(f"{'cell tokens':>11} {'per (cell, expert)':>18} {'drop':>7} "
          f"{REAL['name'] + ' cell, same load':>28}")
    for cell_seqs in (1, 2, 4, 8, 16, 32, 64):
        if cell_seqs > args.sequences:
            break
        frac = drop_fraction(cfg, params, bias, cell_seqs, seq, args.sequences)
        tokens = cell_seqs * seq
        row = {"cell_tokens": tokens, "expected_per_cell_expert": tokens * cfg.top_k
               / cfg.n_experts, "drop_frac": frac, "real_cell_same_load": tokens * scale}
        rows.append(row)
        print(f"{tokens:>11} {row['expected_per_cell_expert']:>18.0f} {frac:>7.2%} "
              f"{row['real_cell_same_load']:>28,.0f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rung": rung.name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
