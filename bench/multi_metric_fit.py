"""`ladder fit --metric GLOB` on public per-domain tables (issue 23, item 1): how many metrics fit,
how many laws one law.json holds, the time, and (Gadre) each law against its held-out runs.

Two tables, built from ../shared/anchors (never copied into the project) in a temporary folder:

- ``marin``: the Marin mixture-swap study's old ladder (marin-community/marin#9126): the final
  Paloma CE (``paloma/SUBSET/loss``) and BPB (``paloma/SUBSET/bpb``) of 16 subsets at d768,
  d1024, d1536, as a long table (a ``metric`` column); fitted with ``--metric 'paloma/*/loss'``.
- ``gadre``: Gadre et al. 2024's C4-trained runs (``runs_tidy.csv``), one loss column per eval
  set (8: ``loss_openlm``, ``loss_c4_val``, 5 Paloma subsets, ``loss_val_de-en_100``), a wide
  table; open_lm_1b and open_lm_7b are held out (the paper's targets) and every law is scored on
  them: relative error and whether the 90% band holds the measured loss.

``--vs-single`` also fits every metric alone (``--metric KEY``) and prints the ratio of the time
of the one multi-metric command to the sum of the single ones, measured side by side.

    python bench/multi_metric_fit.py [--table marin|gadre|both] [--vs-single] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path


def _anchors() -> Path:
    """../shared/anchors beside the repository (or beside any folder above it: a git worktree
    may sit deeper than the main checkout)."""
    for up in Path(__file__).resolve().parents[1:]:
        cand = up.parent / "shared" / "anchors"
        if cand.is_dir():
            return cand
    return Path(__file__).resolve().parents[2] / "shared" / "anchors"


def marin_table(anchors: Path, out: Path) -> tuple[Path, str, None]:
    src = anchors / "marin_mixture_study" / "mix_study_final-2026.09.15.1_point_speedups.csv"
    rows = []
    with open(src, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({"run": r["size"], "compute": r["baseline_compute"], "fraction": 1.0,
                         "metric": f"paloma/{r['subset']}/{r['metric']}",
                         "loss": r["baseline_loss"]})
    return _write_csv(out / "marin_old_paloma_long.csv", rows), "paloma/*/loss", None


GADRE_TARGETS = ("open_lm_1b", "open_lm_7b")   # the paper's held-out models


def gadre_table(anchors: Path, out: Path) -> tuple[Path, str, list[dict]]:
    src = anchors / "gadre2024_overtraining" / "runs_tidy.csv"
    with open(src, newline="") as f:
        runs = [r for r in csv.DictReader(f) if r["dataset"] == "c4_original"]
    losses = [c for c in runs[0] if c.startswith("loss_") and "_seq_" not in c]
    table, held = [], []
    for r in runs:
        row = {"run": r["name"], "params": r["N"], "active_params": r["N"],
               "tokens": r["D_tokens"], "compute": r["flops_6ND"], "fraction": 1.0,
               **{c: r[c] for c in losses}}
        (held if r["model"] in GADRE_TARGETS else table).append(row)
    return _write_csv(out / "gadre_c4_wide.csv", table), "loss_*", held


def _write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _ladder(*argv) -> tuple[int, str, str, float]:
    from ladder.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    t0 = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue(), time.process_time() - t0


def run(name: str, anchors: Path, tmp: Path, vs_single: bool) -> dict:
    path, glob, held = {"marin": marin_table, "gadre": gadre_table}[name](anchors, tmp)
    law = tmp / f"{name}.json"
    code, out, err, cpu = _ladder("fit", path, "--metric", glob, "--json", "--out", law)
    rec = {"table": name, "glob": glob, "exit": code, "cpu_seconds": round(cpu, 1)}
    if code != 0:
        rec["error"] = err.strip().splitlines()[-1]
        return rec
    doc = json.loads(out)
    rec.update(metrics=len(doc["summary"]), laws_written=len(json.loads(law.read_text())["laws"]),
               summary=[{k: r.get(k) for k in ("metric", "form", "exponents",
                                              "rollout_mean_abs_final",
                                              "leave_largest_out_abs_final",
                                              "band_half_width_rel", "seconds")}
                        for r in doc["summary"]])
    if held:
        from ladder.fit import load_laws
        scored = []
        for key, lw in load_laws(law).items():
            for r in held:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    p = lw.predict(params=float(r["params"]), active_params=float(r["params"]),
                                   tokens=float(r["tokens"]), compute=float(r["compute"]),
                                   fraction=1.0)
                actual = float(r[key])
                scored.append({"metric": key, "run": r["run"], "actual": actual,
                               "predicted": float(p.loss), "lo": float(p.lo), "hi": float(p.hi),
                               "error": float(p.loss) / actual - 1,
                               "inside": bool(float(p.lo) <= actual <= float(p.hi))})
        rec["held_out"] = scored
        rec["held_out_mean_abs_error"] = sum(abs(s["error"]) for s in scored) / len(scored)
        rec["held_out_coverage"] = f"{sum(s['inside'] for s in scored)}/{len(scored)}"
    if vs_single:
        single = 0.0
        for r in doc["summary"]:
            c, _, e, t = _ladder("fit", path, "--metric", r["metric"], "--json", "--out", "")
            if c != 0:
                raise SystemExit(f"{r['metric']} alone: {e.strip()}")
            single += t
        rec["single_cpu_seconds"] = round(single, 1)
        rec["multi_over_single"] = round(cpu / single, 3)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchors", type=Path, default=_anchors())
    ap.add_argument("--table", choices=["marin", "gadre", "both"], default="both")
    ap.add_argument("--vs-single", action="store_true",
                    help="also fit each metric alone; the ratio of CPU times")
    ap.add_argument("--json", action="store_true", help="one JSON list, not text")
    args = ap.parse_args(argv)
    names = ["marin", "gadre"] if args.table == "both" else [args.table]
    with tempfile.TemporaryDirectory() as d:
        recs = [run(n, args.anchors, Path(d), args.vs_single) for n in names]
    if args.json:
        print(json.dumps(recs))
        return 0
    for r in recs:
        vs = (f"; {r['multi_over_single']}x the {r['single_cpu_seconds']} s of fitting each "
              "alone" if "multi_over_single" in r else "")
        print(f"{r['table']}: --metric '{r['glob']}': exit {r['exit']}, "
              f"{r.get('metrics', 0)} metrics fitted, {r.get('laws_written', 0)} laws written, "
              f"{r['cpu_seconds']} s CPU{vs}" + (f"; {r['error']}" if "error" in r else ""))
        for s in r.get("summary", []):
            ex = " ".join(f"{k} {v:.3g}" for k, v in s["exponents"].items())
            print(f"  {s['metric']:<44} {s['form']:<12} {ex:<24} rollout "
                  f"{100 * (s['rollout_mean_abs_final'] or float('nan')):.2f}%  band +-"
                  f"{100 * (s['band_half_width_rel'] or float('nan')):.2f}%  {s['seconds']} s")
        if "held_out" in r:
            print(f"  held out ({', '.join(GADRE_TARGETS)}): mean |error| "
                  f"{100 * r['held_out_mean_abs_error']:.2f}%, inside the 90% band "
                  f"{r['held_out_coverage']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
