"""`ladder compare` on the public Marin mixture-swap ladder (old vs new data mixture at d768,
d1024, d1536; marin-community/marin#9126, which reports a 1.20x compute-equivalent speedup at
d1536, 1.197x in its own fit: macro BPB, the old ladder's zero-floor exponent).

Reads ../shared/anchors/marin_mixture_study/ (never copied into the project): the per-size,
per-subset final BPB and CE of `point_speedups.csv`, written as two wide points tables (one
column per metric: ``bpb/SUBSET``, ``loss/SUBSET`` and the macro means ``bpb/macro``,
``loss/macro``, the mean over the 16 subsets as the issue computes it) into a temporary
directory, then runs the command itself. Two ways:

- ``--method ours`` (default): the project's own fit (compute form, the asymptote rule);
- ``--method authors``: the study's own method, a zero-floor power law by least squares
  (``--form compute --fix E=1e-9 --objective ols``: E = 1e-9 is a zero floor to 1e-9 of a
  ~1 BPB loss), which should reproduce its 1.197x.

    python bench/mixture_compare.py [--method ours|authors] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from collections import defaultdict
from pathlib import Path


def _anchor() -> Path:
    """../shared/anchors/marin_mixture_study beside the repository (or beside any folder above
    it: a git worktree may sit deeper than the main checkout)."""
    for up in Path(__file__).resolve().parents[1:]:
        cand = up.parent / "shared" / "anchors" / "marin_mixture_study"
        if cand.is_dir():
            return cand
    return Path(__file__).resolve().parents[2] / "shared" / "anchors" / "marin_mixture_study"


ANCHOR = _anchor()
POINTS = "mix_study_final-2026.09.15.1_point_speedups.csv"
# the W&B runs of each side (the anchor's README)
RUNS = {"old": {"d768": "rav-ladder-d768-v2", "d1024": "rav-ladder-d1024",
                "d1536": "rav-ladder-d1536"},
        "new": {s: f"h100-mix25-20260912-{s}" for s in ("d768", "d1024", "d1536")}}


def tables(anchor: Path, out: Path) -> tuple[Path, Path, list[str]]:
    """old.csv and new.csv (run, compute, one column per metric) from the anchor's points."""
    path = anchor / POINTS
    if not path.is_file():
        sys.exit(f"{path}: not found (the anchors live in ../shared/anchors beside the repo)")
    vals: dict = defaultdict(dict)   # (side, size) -> {column: value}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for side, loss, comp in (("old", "baseline_loss", "baseline_compute"),
                                     ("new", "variant_loss", "variant_compute")):
                d = vals[(side, r["size"])]
                d["compute"] = float(r[comp])
                d[f"{r['metric']}/{r['subset']}"] = float(r[loss])
    metrics = []
    for (_side, _size), d in vals.items():
        for kind in ("bpb", "loss"):
            subs = [v for k, v in d.items() if k.startswith(kind + "/")]
            d[f"{kind}/macro"] = sum(subs) / len(subs)
        metrics = sorted(k for k in d if k != "compute")
    paths = []
    for side in ("old", "new"):
        p = out / f"{side}.csv"
        with open(p, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "compute", *metrics])
            for size in ("d768", "d1024", "d1536"):
                d = vals[(side, size)]
                w.writerow([RUNS[side][size], repr(d["compute"]),
                            *(repr(d[m]) for m in metrics)])
        paths.append(p)
    order = ["bpb/macro"] + [m for m in metrics if m.startswith("bpb/") and m != "bpb/macro"]
    order += ["loss/macro"] + [m for m in metrics if m.startswith("loss/") and m != "loss/macro"]
    return paths[0], paths[1], order


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", choices=["ours", "authors"], default="ours")
    p.add_argument("--anchor", default=str(ANCHOR))
    p.add_argument("--metric", action="append", default=None,
                   help="metrics (default: every BPB and CE column, macro first)")
    p.add_argument("--out", default=None, help="compare.json and the figures go here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--bootstrap", type=int, default=200)
    args = p.parse_args(argv)
    from ladder.cli.main import main as ladder
    with tempfile.TemporaryDirectory() as tmp:
        old, new, metrics = tables(Path(args.anchor), Path(tmp))
        cmd = ["compare", str(old), str(new), "--bootstrap", str(args.bootstrap)]
        for m in args.metric or metrics:
            cmd += ["--metric", m]
        if args.method == "authors":
            cmd += ["--fix", "E=1e-9", "--objective", "ols"]
        if args.out:
            cmd += ["--out", args.out]
        if args.json:
            cmd.append("--json")
        print("ladder " + " ".join(cmd).replace(tmp, "$TMP"), file=sys.stderr)
        return ladder(cmd)


if __name__ == "__main__":
    sys.exit(main())
