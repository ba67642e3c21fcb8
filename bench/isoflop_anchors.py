"""`ladder isoflop` on the public IsoFLOP anchors beside their published exponents (issue 24,
item 5): Porian et al. 2024 (RefinedWeb, tuned hyper-parameters, short warmup, constant LR,
standard parameter count, validation loss: N* ~ C^0.497 [0.4915, 0.5032], D* ~ C^0.503
[0.4969, 0.5087], their fit_results.csv, bootstrap_weighted_CI) and Llama 3 (Fig. 2 digitised by
E. Czech: D* = 0.29 C^0.53, which chose 402B parameters and 16.55T tokens at 3.8e25 FLOPs).

Each anchor is selected into a temporary CSV and run through the command line as a user would
(`ladder isoflop FILE --column ... --budget C --json`); nothing of the anchors is kept.

    python bench/isoflop_anchors.py [--anchors ../shared/anchors] [--bootstrap 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ladder.cli.main import main as ladder  # noqa: E402


def run(argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = ladder(argv)
    if code:
        raise SystemExit(f"ladder {' '.join(argv)}: exit {code}")
    return json.loads(out.getvalue())


def num(x) -> float:
    """A number of `ladder isoflop --json` (one that cannot be computed is the string "NaN")."""
    return float(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchors", default=str(Path(__file__).resolve().parents[1] / ".." /
                                             "shared" / "anchors"),
                    help="the anchors folder (default: ../shared/anchors beside the checkout)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    args = ap.parse_args(argv)
    root = Path(args.anchors)
    if not root.is_dir():
        print(f"no anchors at {root} (--anchors DIR)", file=sys.stderr)
        return 66
    tmp = Path(tempfile.mkdtemp())
    rows = []
    p = root / "porian2024" / "isoflop_points.csv"
    if p.exists():
        pts = pd.read_csv(p)
        sel = pts[(pts.dataset == "rw") & (pts.hparams == "tuned") & (pts.warmup == "short")
                  & (pts.decay == "const") & (pts.param_count == "standard")
                  & (pts.loss_source == "val")]
        f = tmp / "porian.csv"
        sel[["flops", "N", "D_tokens", "loss"]].to_csv(f, index=False)
        r = run(["isoflop", str(f), "--column", "compute=flops", "--column", "params=N",
                 "--column", "tokens=D_tokens", "--bootstrap", str(args.bootstrap), "--json"])
        rows.append(("Porian 2024 tuned RW", "a (N* ~ C^a)", r["n_exponent"],
                     r["n_exponent_interval"], 0.497, (0.4915, 0.5032), r))
        rows.append(("Porian 2024 tuned RW", "b (D* ~ C^b)", r["d_exponent"],
                     r["d_exponent_interval"], 0.503, (0.4969, 0.5087), r))
    p = root / "llama3_isoflop_czech" / "isoflops_points.csv"
    if p.exists():
        r = run(["isoflop", str(p), "--column", "compute=compute_budget", "--column",
                 "tokens=training_tokens", "--column", "loss=validation_loss", "--budget",
                 "3.8e25", "--bootstrap", str(args.bootstrap), "--json"])
        rows.append(("Llama 3 (digitised)", "b (D* ~ C^b)", r["d_exponent"],
                     r["d_exponent_interval"], 0.53, None, r))
        rows.append(("Llama 3 (digitised)", "D* at 3.8e25", r["d_opt"], r["d_opt_interval"],
                     16.55e12, None, r))
        rows.append(("Llama 3 (digitised)", "N* at 3.8e25", r["n_opt"], r["n_opt_interval"],
                     402e9, None, r))
    print(f"{'anchor':<22} {'quantity':<14} {'ours':>10} {'90% interval':>24} "
          f"{'published':>10} {'published interval':>20}  approach 1")
    for name, q, v, iv, pub, piv, r in rows:
        a1 = r["approach1"]
        a1v = {"a (N* ~ C^a)": a1["n_exponent"], "b (D* ~ C^b)": a1["d_exponent"],
               "D* at 3.8e25": a1.get("d_opt"), "N* at 3.8e25": a1.get("n_opt")}[q]
        print(f"{name:<22} {q:<14} {num(v):>10.4g} [{num(iv[0]):>10.4g}, {num(iv[1]):>10.4g}] "
              f"{pub:>10.4g} {'' if piv is None else f'[{piv[0]:.4g}, {piv[1]:.4g}]':>20}  "
              f"{num(a1v):.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
