"""Drop fraction against the capacity cell (issue 22 item 2).

Capacity is counted per (cell, expert): each expert takes ceil(cf x cell tokens x k / E)
assignments of a cell of ``model.capacity_tokens`` consecutive tokens. The smaller the cell, the
larger its relative load fluctuations and the more it drops. This trains one cpu-ladder rung with
the recipe's routing (the marin optimizer and init, the quantile balancing rule, capacity factor
1.15; its own cells of 2 sequences) and then evaluates the trained model's held-out drop
fraction (``moe/drop_frac``, every layer's assignments, with the drops of earlier layers in
place) with cells of 1, 2, 4, ... sequences, one cell per call.

What a cell means depends on E and k: the expected assignments per (cell, expert) are
cell x k / E. The table gives, for each toy cell, the 1.6B-A61M cell with the same expected load
per (cell, expert) (k = 8 of E = 384 there: x 12 the toy's tokens for the toy's k = 2 of E = 8).
That is a proxy, not a measurement of the 1.6B model: a trained router's clustering decides the
drops as much as the load does.

    nice python bench/capacity_cell.py [--out runs_capacity_cell] [--rung -1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

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
    from ladder.checkpointing import Checkpoints
    from ladder.step import make_mesh, programs
    from ladder.train import train_rung
    from ladder.trainconfig import RunArgs, TrainConfig, resolve_rung

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

    import model as M
    from ladder.data import stdlib_corpus

    cfg = cfg.replace(capacity_tokens=cell_seqs * seq_len)
    step = jax.jit(lambda p, b, t, y: M.loss_fn(cfg, p, b, t, y)[1]["moe/drop_frac"])
    n = max(1, sequences // cell_seqs)
    batches = stdlib_corpus().eval_batches(n, cell_seqs, seq_len)
    return float(np.mean([float(step(params, bias, b["tokens"], b["targets"]))
                          for b in batches]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs_capacity_cell", help="runs directory")
    ap.add_argument("--rung", type=int, default=-1, help="which cpu rung (default: the largest)")
    ap.add_argument("--sequences", type=int, default=512,
                    help="held-out sequences per cell size (default: 512)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
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
