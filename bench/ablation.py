"""What the hero recipe's pieces do to the fitted law, on the cpu ladder (issue 12, item 6).

Three variants of ``ladder/ladders/cpu.toml``, each a ladder of its 4 rungs (the proxy hero is not
trained), each trained with the default TrainConfig and fitted with the law ``ladder demo`` fits,
exactly as it fits it (held-out dropless loss, 200 run-level bootstrap replicates, level 0.9):

- ``recipe``: the full recipe: the marin optimizer (MuonH/AdamH/Adam), the quantile balancing
  rule, capacity 1.15, the recipe's init, half-RoPE on local layers / NoPE on global ones,
  non-parametric QK-norm with q x 1.3, the embedding norm (issue 12 item 2), and GatedNorm, the
  short convolutions, XSA and the head gate (item 4);
- ``adamw``: AdamW and every model switch at its default (the cpu ladder before issue 21);
- ``recipe-no-item4``: the recipe without GatedNorm, convolutions, XSA and the head gate.

It prints, side by side, the fitted alpha, E and A with their intervals (and which asymptote
variant the short-ladder rule chose: free, prior or fixed E), a model-free slope -dlog L/dlog C
between the smallest and the largest rung, the compute range and each rung's final loss, and
writes the same as JSON (``--json``). Finished rungs are reused (their summary.json).

    nice python bench/ablation.py [--out runs_ablation] [--only recipe] [--json FILE]

On the cpu ladder GatedNorm's rank 128 is wider than every model (d 24 ... 48): it runs at full
rank d there (``ModelConfig.gated_rank``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy

METRIC = "eval_dropless/loss"   # what the demo and the real ladder fit
FORM = "trajectory-capacity"    # the demo's form (ladder/cli/demo.py::FORM)
LEVEL = 0.9
BOOTSTRAP = 200

# the recipe's settings as ladder-file recipe keys (ladder/ladders/marin-535b.toml)
ITEM2 = {"init": "recipe", "rope_fraction": 0.5, "global_rope": False, "qk_norm": "rms",
         "qk_mult": 1.3, "embed_norm": True}
ITEM4 = {"gated_norm_rank": 128, "conv_kernel": 4, "xsa": True, "head_gate": True}
RECIPE = {"bias_rule": "quantile", "capacity_factor": 1.15, "optimizer": {"kind": "marin"},
          **ITEM2}
VARIANTS = {
    "recipe": {**RECIPE, **ITEM4},
    "adamw": {"bias_rule": "threshold", "capacity_factor": 1.25, "optimizer": {"kind": "adamw"},
              "init": "gpt2", "rope_fraction": 1.0, "global_rope": True, "qk_norm": "learned",
              "qk_mult": 1.0, "embed_norm": False},
    "recipe-no-item4": RECIPE,
}


def variant_ladder(name: str):
    """The cpu ladder with the recipe keys of variant ``name`` replaced, named cpu-NAME."""
    from ladder.specs import parse_ladder

    obj = tomllib.loads((ROOT / "ladder" / "ladders" / "cpu.toml").read_text())
    obj["recipe"] = {**obj["recipe"], **VARIANTS[name]}
    obj["name"] = f"cpu-{name}"
    return parse_ladder(obj)


def run_variant(name: str, out: Path, bootstrap: int) -> dict:
    from ladder.fit import fit_law, load_points
    from ladder.trainer.train import train_rung
    from ladder.trainer.trainconfig import TrainConfig

    ladder = variant_ladder(name)
    finals, names, dirs = {}, {}, []
    t0 = time.time()
    for rung in ladder.rungs:
        run_dir = out / ladder.name / rung.name
        summary = train_rung(rung, run_dir, TrainConfig(), resume=True)
        if summary.get("status") != "complete":
            raise RuntimeError(f"{ladder.name}:{rung.name} ended {summary.get('status')}; see "
                               f"{run_dir}")
        # keyed by width: the names differ between variants (the pieces add parameters)
        key = f"d={rung.model.d_model}"
        finals[key] = float(summary["final"][METRIC])
        names[key] = rung.name
        dirs.append(run_dir)
        print(f"  {ladder.name}:{rung.name}: final {METRIC} {finals[key]:.4f}", flush=True)
    train_s = time.time() - t0
    # a model-free slope beside the fit: -dlog L / dlog C between the smallest and the largest
    # rung (final losses, planned compute without the LM head, the fit's convention)
    first, last = ladder.rungs[0], ladder.rungs[-1]
    slope = -(math.log(finals[f"d={last.model.d_model}"] / finals[f"d={first.model.d_model}"])
              / math.log(last.compute() / first.compute()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points = load_points([str(d) for d in dirs], metric=METRIC, include_incomplete=False)
    res = fit_law(points, form=FORM, bootstrap=bootstrap, level=LEVEL, seed=0)
    rule = res.diagnostics.get("asymptote_rule", {})
    return {"variant": name, "ladder": ladder.name, "settings": VARIANTS[name],
            "params": res.params, "intervals": {k: list(map(float, v))
                                                for k, v in res.intervals.items()},
            "asymptote": rule.get("chosen", "free"),
            "final": finals, "rungs": names, "slope": slope,
            "compute": [first.compute(), last.compute()], "train_seconds": round(train_s, 1)}


def _ci(row: dict, name: str) -> str:
    v = row["params"].get(name)
    lo, hi = row["intervals"].get(name, [float("nan")] * 2)
    return f"{v:.3g} [{lo:.3g}, {hi:.3g}]"


def table(rows: list[dict]) -> str:
    """Markdown table: one row per variant, the fitted parameters and each rung's final loss."""
    rungs = list(rows[0]["final"])
    head = (["variant", f"alpha ({LEVEL:.0%})", "E", "A", "E fit", "slope", "C range"]
            + [f"{r} loss" for r in rungs])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["variant"], _ci(row, "alpha"), _ci(row, "E"), _ci(row, "A"),
                 row["asymptote"], f"{row['slope']:.3f}",
                 f"{row['compute'][0]:.2g}-{row['compute'][1]:.2g}"]
        cells += [f"{row['final'][r]:.4f}" for r in rungs]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs_ablation",
                    help="runs directory, one ladder per variant (default: runs_ablation)")
    ap.add_argument("--only", action="append", choices=list(VARIANTS),
                    help="run only this variant (repeatable; default: all three)")
    ap.add_argument("--bootstrap", type=int, default=BOOTSTRAP,
                    help=f"run-level bootstrap replicates of each fit (default: {BOOTSTRAP})")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="also write the rows as JSON to FILE (default: none)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    rows = []
    for name in args.only or list(VARIANTS):
        print(f"{name}: {VARIANTS[name]}", flush=True)
        rows.append(run_variant(name, out, args.bootstrap))
    print()
    print(table(rows))
    print(f"\nfit: {FORM} law on {METRIC}, {args.bootstrap} run-level bootstrap replicates, "
          f"{LEVEL:.0%} intervals; reproduce: nice python bench/ablation.py --out {args.out}")
    if args.json:
        from ladder.io import atomic_write_json

        atomic_write_json(Path(args.json), {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
