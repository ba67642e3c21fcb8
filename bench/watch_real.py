"""The watcher over real runs, each treated as a target: a false-alarm check on healthy runs.

For every run directory of a ladder output (``RUNS/<ladder>/<rung>/`` with config.json and
metrics.jsonl; the rungs and the proxy hero of ``ladder demo``), pre-register that run from the
given law with the health references of the *other* ladder rungs (leave-one-rung-out; the hero
gets all rungs, as in the demo), then judge its whole metrics file. On healthy runs every alert
should be info. Prints each run's alerts, the calibrated thresholds and how close the run came
to each health limit (spike z against k; trailing medians against the envelope limits).

    PYTHONPATH=. .venv/bin/python bench/watch_real.py DEMO_DIR   # holds law.json and runs/
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from ladder.io import as_float, read_json, read_metrics  # noqa: E402
from ladder.predict import forecast as fc  # noqa: E402
from ladder.cli.predict import load_law_file  # noqa: E402
from ladder.predict.prereg import make_prereg  # noqa: E402
from ladder.predict.watch import PreregView, WatchConfig, check  # noqa: E402
from ladder.predict.watch.rules.health import rolling_median  # noqa: E402


def headroom(doc: dict, rows: list[dict]) -> str:
    """How close the run came to each health threshold: the spike rule's largest z against k,
    and the trailing medians against the envelope limits (the watcher's own quantities)."""
    view = PreregView.of(doc)
    cfg = view.config
    step = np.array([r["step"] for r in rows], float)
    frac = np.array([r.get("progress", np.nan) for r in rows], float)
    frac = np.where(np.isfinite(frac), frac, step / view.steps)

    def col(k):
        return np.array([np.nan if as_float(r.get(k)) is None else as_float(r.get(k))
                         for r in rows], float)
    out = []
    z = fc.spike_scores(col("train/loss"), cfg.spike_window).z
    out.append(f"spike max z {np.nanmax(z):.2f} (k {cfg.spike_k:g})")
    for key, side in (("moe/router_entropy", "below"), ("moe/load_max_over_mean", "above"),
                      ("moe/drop_frac", "above")):
        env = view.envelope(key, frac)
        if env is None:
            continue
        med = rolling_median(col(key), cfg.drop_window, shift=False)
        with np.errstate(all="ignore"):
            if side == "below":
                lim = env.lo * np.exp(-(env.tol_below + cfg.envelope_margin))
                r = np.nanmin(med / lim)
            else:
                lim = env.hi * np.exp(env.tol_above + cfg.envelope_margin)
                if key == "moe/drop_frac":  # where the ladder has no value: absolute limit
                    lim = np.where(np.isfinite(env.hi), np.fmax(lim, cfg.drop_floor),
                                   cfg.drop_warn_abs)
                r = np.nanmax(med / lim)
        out.append(f"{key.split('/')[-1]} {'min' if side == 'below' else 'max'} "
                   f"{r:.2f}x its limit")
    return "; ".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("demo", help="a `ladder demo` output directory (law.json, runs/)")
    ap.add_argument("--law", default=None, help="law.json (default: DEMO/law.json)")
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=VALUE",
                    help="override a decision-rule parameter (WatchConfig)")
    args = ap.parse_args(argv)
    demo = Path(args.demo)
    law = load_law_file(args.law or str(demo / "law.json"))
    overrides = {}
    for item in args.rule:
        k, _, v = item.partition("=")
        overrides[k] = type(getattr(WatchConfig(), k))(v)
    cfg = WatchConfig(**overrides)
    from ladder.specs import Rung
    dirs = sorted(p.parent for p in demo.glob("runs/*/*/metrics.jsonl"))
    if not dirs:
        print(f"no runs/*/*/metrics.jsonl under {demo}")
        return 66
    ladder_dirs = [d for d in dirs if not read_json(d / "config.json")["rung"].get("is_target")]
    total_bad = 0
    for d in dirs:
        rung = Rung.from_dict(read_json(d / "config.json")["rung"])
        refs = [x for x in ladder_dirs if x != d]
        with tempfile.TemporaryDirectory() as tmp:
            for x in refs:
                (Path(tmp) / x.name).symlink_to(x.resolve())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = make_prereg(law, fc.Target.from_rung(rung), runs=tmp, config=cfg,
                                  created="2026-01-01T00:00:00Z")
        rows = read_metrics(d / "metrics.jsonl")
        res = check(doc, rows, None, now=0)
        bad = [a for a in res.alerts if a.severity != "info"]
        total_bad += bool(bad)
        cal = doc["decision_rule"]["calibration"] or {}
        tol = {k.split("/")[-1]: (v or {}).get("below" if "entropy" in k else "above")
               for k, v in (cal.get("envelope_tolerance") or {}).items()}
        print(f"{rung.name:<14} {'target' if rung.is_target else 'rung  '} refs {len(refs)}: "
              f"{len(bad)} warn/critical, {len(res.alerts) - len(bad)} info; spike_k "
              f"{doc['decision_rule']['parameters']['spike_k']:.2f} (ladder max z "
              f"{(cal.get('spike_k') or {}).get('max_z') or float('nan'):.2f}); envelope "
              f"tolerance {', '.join(f'{k} {v:.2f}' for k, v in tol.items() if v is not None)}")
        print(f"    closest approach: {headroom(doc, rows)}")
        for a in res.alerts:
            if a.kind not in ("input", "rewind"):
                print("    " + a.line())
    print(f"\n{total_bad} of {len(dirs)} healthy runs had a warn/critical alert (target: 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
