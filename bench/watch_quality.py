"""Calibration and detection quality of the pre-registration + watcher, and its speed.

On a synthetic ladder whose truth is known (tests/synthetic.py: the trajectory form, run-level
offsets, eval noise), and optionally on real ladder runs (``--runs DIR``):

1. coverage of the 90% band in leave-one-rung-out backtests (fit.fit_law "trajectory" refitted
   without each rung; the held-out rung's eval points inside the combined band);
2. false-alarm rate on held-out healthy runs of a target beyond the ladder (target: none);
3. detection rate and latency (in evals after onset; one eval per 1% of the run) for injected
   faults: loss +2% from 50% on, a slow upward drift, a NaN, a token-drop-fraction jump, an LR
   spike (train loss +10% within 3 steps; caught by the spike rule) and a router collapse;
4. speed: judging a 1M-line metrics file, next to the time to merely json-parse its lines.

``--family`` measures instead the multiple-comparison rule of a multi-metric pre-registration
(issue 23; ladder.predict.watch.multi): the family-wise false-alarm rate (a healthy run with any
warn/critical alert) for 1 and for 16 independent metrics, each metric's law fitted on the
ladder, with the Sidak-adjusted rule and without it (every metric at the single-metric rule),
and the detection of one drifting metric among 16 (caught, named, the other 15 quiet).

    PYTHONPATH=. .venv/bin/python bench/watch_quality.py [--quick] [--runs DIR]
    PYTHONPATH=. .venv/bin/python bench/watch_quality.py --family [--ladders 3 --healthy 40]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.band_calibration import leave_one_rung_out
from ladder.predict import forecast as fc
from tests import synthetic as sy
from ladder.predict.prereg import make_prereg
from ladder.predict.watch import PreregView, WatchConfig, check

METRIC = "eval_dropless/loss"


def fit_fn(bootstrap: int, seed: int = 0):
    from ladder.fit import fit_law

    def f(df):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fit_law(df, form="trajectory", bootstrap=bootstrap, metric=METRIC,
                           backtest=False, seed=seed)
    return f


def ladder_points(truth, rungs, noise, seed, every=5):
    runs = [sy.make_run(truth, t, noise=noise, seed=seed * 100 + i) for i, t in enumerate(rungs)]
    pts = sy.points_table(runs)
    keep = (np.rint(pts["fraction"] * 100).astype(int) % every == 0)
    return runs, pts[keep].reset_index(drop=True)


def first_alert(alerts, kinds, severities=("warn", "critical")):
    for a in alerts:
        if a.kind in kinds and a.severity in severities:
            return a
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer ladders and runs (about 1 min)")
    ap.add_argument("--ladders", type=int, default=None)
    ap.add_argument("--healthy", type=int, default=None, help="healthy target runs per ladder")
    ap.add_argument("--bootstrap", type=int, default=60)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", default=None, help="real ladder run directories (optional)")
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=VALUE",
                    help="override a decision-rule parameter (WatchConfig), e.g. trend_window=0.5")
    ap.add_argument("--skip-loro", action="store_true", help="skip part 1 (the slow refits)")
    ap.add_argument("--family", action="store_true",
                    help="the multi-metric family-wise false-alarm rate (1 vs 16 metrics) and "
                         "the detection of one drifting metric among 16, only")
    ap.add_argument("--metrics", type=int, default=16, help="metrics in the family (--family)")
    ap.add_argument("--truth-law", action="store_true",
                    help="--family with each metric's true law (its band: the known run-to-run "
                         "noise) instead of a fitted one: the multiple-comparison rule alone, "
                         "without the fit's own error (shared by every run of a ladder)")
    args = ap.parse_args(argv)
    if args.family:
        return family(args)
    n_ladders = args.ladders or (2 if args.quick else 4)
    n_healthy = args.healthy or (10 if args.quick else 25)
    out: dict = {}
    overrides = {}
    for item in args.rule:
        k, _, v = item.partition("=")
        overrides[k] = type(getattr(WatchConfig(), k))(v)
    if overrides:
        print(f"decision-rule overrides: {overrides}")

    truth = sy.Truth()
    noise = sy.RunNoise(run_sigma=0.005, eval_sigma=0.004)
    targets = sy.ladder_targets(8, ratio=2.5, steps0=80)
    rungs, target = targets[:7], targets[7]
    print(f"synthetic ladder: {len(rungs)} rungs, compute {rungs[0].compute:.2e}..."
          f"{rungs[-1].compute:.2e}, target {target.compute:.2e} ({target.steps} steps); truth "
          f"{truth}; run sd {noise.run_sigma:.2%} (log), eval sd {noise.eval_sigma}")

    # ---------------------------------------------------------------- 1. LORO coverage
    t0 = time.perf_counter()
    if args.skip_loro:
        n_loro = 0
    else:
        n_loro = n_ladders
    cover = []
    per_rung: dict[str, list] = {}
    for k in range(n_loro):
        runs, pts = ladder_points(truth, rungs, noise, seed=k)
        en = fc.eval_noise_from_runs([fc.LadderRun(str(i), r.target.name, r.target.steps, r.rows)
                                      for i, r in enumerate(runs)], METRIC)
        cal = leave_one_rung_out(pts, fit_fn(args.bootstrap, k), level=0.9,
                                    eval_noise=en.sigma, min_fraction=0.05)
        cover.append(cal)
        for r in cal.rungs:
            per_rung.setdefault(r.run, []).append(r)
        if k == 0:
            print(f"eval noise estimated from the ladder: {en.sigma:.4f} (true "
                  f"{noise.eval_sigma}, n={en.n})")
    if cover:
        n = max(1, sum(c.n for c in cover))
        inside = sum(r.inside for c in cover for r in c.rungs)
        missing = sum(r.missing for c in cover for r in c.rungs)
        inside_law = sum(r.inside_law_only for c in cover for r in c.rungs)
        print(f"\n1. leave-one-rung-out coverage of the 90% band ({n_ladders} ladders x "
              f"{len(rungs)} rungs, fit 'trajectory', bootstrap {args.bootstrap}): "
              f"{inside / n:.1%} of {n} points ({missing} without a band); the law's band alone, "
              f"without the eval-noise term: {inside_law / n:.1%}  "
              f"[{time.perf_counter() - t0:.0f} s]")
        for name, rs in per_rung.items():
            nn = sum(r.n for r in rs)
            print(f"   held out {name}: {sum(r.inside for r in rs) / nn:6.1%}  "
                  f"(above {sum(r.above for r in rs)}, below {sum(r.below for r in rs)}, no band "
                  f"{sum(r.missing for r in rs)}), mean |rel err| "
                  f"{np.mean([r.mean_rel_error for r in rs]):.3%}")
        out["loro_coverage"] = inside / n
        out["loro_coverage_law_band_only"] = inside_law / n
        out["loro_points"] = n
        out["loro_per_rung"] = {name: sum(r.inside for r in rs) / sum(r.n for r in rs)
                                for name, rs in per_rung.items()}

    # perfect-law reference: the truth's own band on fresh runs (checks the band combination)
    tl = sy.TruthLaw(truth, run_sigma=noise.run_sigma)
    tr_pts = sy.points_table([sy.make_run(truth, target, noise=noise, seed=9000 + s)
                              for s in range(40)])
    tr_pts["run"] = "x"
    f = fc.forecast(tl, target, level=0.9, eval_noise=noise.eval_sigma)
    view = PreregView.of({"metric": METRIC, "target": target.to_dict(), "forecast": f.points(),
                          "final": f.final, "band_level": 0.9})
    e, lo, hi = view.expected(tr_pts["fraction"].to_numpy(), alert=False)
    y = tr_pts["loss"].to_numpy()
    ok = np.isfinite(lo)
    print(f"   (the true law's own 90% band on 40 fresh target runs: "
          f"{np.mean((y[ok] >= lo[ok]) & (y[ok] <= hi[ok])):.1%})")

    # ---------------------------------------------------------------- 2-3. alarms and detection
    t0 = time.perf_counter()
    faults = {"shift +2% at 50%": sy.Fault("shift", 0.5, 0.02),
              "drift to +3% (30%->end)": sy.Fault("drift", 0.3, 0.03),
              "NaN at 60%": sy.Fault("nan", 0.6),
              "drop frac 3%->15% at 40%": sy.Fault("drop", 0.4, 0.15),
              "LR x10 at 60% (loss +10%)": sy.Fault("lrspike", 0.6, 0.10),
              "router collapse at 50%": sy.Fault("collapse", 0.5, 0.2)}
    fault_kinds = {"shift": ("above_band", "trend"), "drift": ("above_band", "trend"),
                   "nan": ("nan",),
                   "drop": ("drop_frac",), "lrspike": ("spike",), "collapse": ("router",)}
    levels = (0.99, 0.9)
    false_any = {lv: 0 for lv in levels}
    false_kinds: dict[str, int] = {}
    false_by_ladder: dict[int, int] = {}
    healthy_total = 0
    det = {name: [] for name in faults}
    for k in range(n_ladders):
        runs, pts = ladder_points(truth, rungs, noise, seed=k)
        law = fit_fn(args.bootstrap, k)(pts)
        tmp = Path(tempfile.mkdtemp())
        for r in runs:  # ladder run dirs: health references + eval noise
            d = tmp / r.target.name
            d.mkdir()
            with open(d / "metrics.jsonl", "w") as fh:
                fh.writelines(json.dumps(row) + "\n" for row in r.rows)
        docs = {lv: make_prereg(law, target, level=0.9, runs=str(tmp),
                                config=WatchConfig(**{"alert_level": lv, **overrides}))
                for lv in levels}
        for s in range(n_healthy):
            seed = 10_000 + 1000 * k + s
            rows = sy.make_run(truth, target, noise=noise, seed=seed).rows
            healthy_total += 1
            for lv in levels:
                res = check(docs[lv], rows, None, now=0)
                bad = [a for a in res.alerts if a.severity != "info"]
                if bad:
                    false_any[lv] += 1
                    if lv == levels[0]:
                        false_by_ladder[k] = false_by_ladder.get(k, 0) + 1
                        for a in bad:
                            false_kinds[a.kind] = false_kinds.get(a.kind, 0) + 1
            for name, fault in faults.items():
                if s >= max(3, n_healthy // 3):
                    continue
                rows_f = sy.make_run(truth, target, noise=noise, seed=seed, fault=fault).rows
                res = check(docs[levels[0]], rows_f, None, now=0)
                a = first_alert(res.alerts, fault_kinds[fault.kind])
                onset_step = math.ceil(fault.at * target.steps)
                if a is None:
                    det[name].append(None)
                else:
                    # evals after onset: one eval per 1% of the run
                    det[name].append((a.step - onset_step) / (target.steps / 100))
    print(f"\n2. false alarms on held-out healthy target runs ({healthy_total} runs, "
          f"{n_ladders} fitted ladders):")
    for lv in levels:
        print(f"   alert band {lv:.0%}: {false_any[lv]} of {healthy_total} runs had a warn/"
              f"critical alert ({false_any[lv] / healthy_total:.1%})"
              + ("  <- default" if lv == WatchConfig().alert_level else ""))
    if false_kinds:
        print(f"   kinds at the default: {false_kinds}; runs per fitted ladder: "
              f"{ {k: false_by_ladder.get(k, 0) for k in range(n_ladders)} } of {n_healthy}")
    out["false_alarm_rate"] = {str(lv): false_any[lv] / healthy_total for lv in levels}
    print(f"\n3. detection (default rule), latency in evals after onset (1 eval = 1% of the "
          f"run)  [{time.perf_counter() - t0:.0f} s]")
    out["detection"] = {}
    for name, lat in det.items():
        got = [x for x in lat if x is not None]
        rate = len(got) / len(lat) if lat else math.nan
        med = float(np.median(got)) if got else math.nan
        mx = float(np.max(got)) if got else math.nan
        print(f"   {name:<26} detected {len(got)}/{len(lat)} ({rate:.0%}), latency median "
              f"{med:.1f}, max {mx:.1f} evals")
        out["detection"][name] = {"rate": rate, "median_evals": med, "max_evals": mx}

    # ---------------------------------------------------------------- 4. speed
    print(f"\n4. speed: a {args.lines:,}-line metrics.jsonl")
    tmp = Path(tempfile.mkdtemp())
    path = tmp / "metrics.jsonl"
    steps_total = args.lines
    big_target = fc.Target(name="big", params=target.params, active_params=target.active_params,
                           tokens=target.tokens / target.steps * steps_total, steps=steps_total,
                           compute=target.compute / target.steps * steps_total,
                           seq_len=target.seq_len)
    law_big = sy.TruthLaw(truth, run_sigma=noise.run_sigma)
    doc_big = make_prereg(law_big, big_target, eval_noise=noise.eval_sigma)
    rng = np.random.default_rng(0)
    tps = big_target.tokens / steps_total
    with open(path, "w") as fh:
        g = np.arange(1, steps_total + 1) / steps_total
        curve = truth.loss(big_target.compute, g)
        tl_ = curve + rng.normal(0, 0.02, g.size)
        gn = 0.3 * np.exp(rng.normal(0, 0.1, g.size))
        for i in range(steps_total):
            s = i + 1
            r = {"step": s, "tokens": s * tps, "progress": s / steps_total, "time": s * 0.5,
                 "train/loss": round(float(tl_[i]), 5), "grad/norm": round(float(gn[i]), 5),
                 "moe/drop_frac": 0.03, "optim/lr": 1e-3,
                 "throughput/tokens_per_s": 123456.0}
            if s % (steps_total // 100) == 0:
                r[METRIC] = round(float(curve[i] + rng.normal(0, 0.004)), 5)
            fh.write(json.dumps(r) + "\n")
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        for line in fh:
            json.loads(line)
    t_parse = time.perf_counter() - t0
    from ladder.predict.live import Watcher
    from ladder.sources import JsonlSource
    print(f"   file {size / 1e6:.0f} MB; json.loads of every line alone: {t_parse:.2f} s "
          f"(this machine, now: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    out["speed"] = {"lines": args.lines, "bare_parse_s": t_parse}
    src = JsonlSource(path)
    t0 = time.perf_counter()
    w = Watcher(doc_big, src, [], None)
    w.poll()
    t_watch = time.perf_counter() - t0
    print(f"   full watch (read + judge {w.state['n_points']:,} rows, {w.state['n_evals']} "
          f"evals): {t_watch:.2f} s = {t_watch / t_parse:.2f}x the bare parse; exit "
          f"{w.exit_code}")
    out["speed"]["watch_s"] = t_watch
    path.unlink()

    # ---------------------------------------------------------------- real runs (optional)
    if args.runs:
        print(f"\n5. real ladder runs under {args.runs}")
        try:
            from ladder.fit import load_points
            pts = load_points([args.runs], metric=METRIC)
            lr = fc.read_ladder_runs(args.runs)
            en = fc.eval_noise_from_runs(lr, METRIC)
            print(f"   {pts['run'].nunique()} runs, {len(pts)} points; eval noise {en.sigma:.4f}")
            if pts["run"].nunique() >= 5:
                cal = leave_one_rung_out(pts, fit_fn(args.bootstrap), level=0.9,
                                            eval_noise=en.sigma, min_fraction=0.05)
                print("   " + cal.report().replace("\n", "\n   "))
                out["real_loro_coverage"] = cal.coverage
            else:
                print("   fewer than 5 runs: a trajectory law (3 across-run parameters) has no "
                      "residual degrees of freedom left out of one; coverage not measured")
        except Exception as e:  # noqa: BLE001 - optional part: report and go on
            print(f"   skipped: {type(e).__name__}: {e}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def family_truths(m: int) -> dict:
    """``m`` per-domain truths around the default one (levels and exponents spread like
    Paloma's domains: E 1.5-2.3, alpha 0.10-0.14)."""
    rng = np.random.default_rng(1234)
    out = {}
    for i in range(m):
        out[f"paloma/d{i:02d}/loss"] = sy.Truth(E=float(rng.uniform(1.5, 2.3)),
                                                A=float(rng.uniform(30, 55)),
                                                alpha=float(rng.uniform(0.10, 0.14)))
    return out


def family(args) -> int:
    from ladder.predict import prereg as pr
    from ladder.predict.watch.multi import family_config
    m = args.metrics
    n_ladders = args.ladders or (2 if args.quick else 3)
    n_healthy = args.healthy or (15 if args.quick else 40)
    truths = family_truths(m)
    keys = list(truths)
    noise = sy.RunNoise(run_sigma=0.005, eval_sigma=0.004)
    targets = sy.ladder_targets(8, ratio=2.5, steps0=80)
    rungs, target = targets[:7], targets[7]
    base = WatchConfig()
    fam_cfg, rec = family_config(base, m)
    print(f"family of {m} independent metrics (own truth, run offset and eval noise each); "
          f"aim: family-wise false-alarm rate <= the single-metric rate at alert level "
          f"{base.alert_level}; Sidak per-metric alert level {fam_cfg.alert_level:.5f}, noise "
          f"multiples x{rec['z_scale']:.3f}; laws: "
          f"{'the truth' if args.truth_law else 'fitted (trajectory)'}; {n_ladders} ladders x "
          f"{n_healthy} healthy target runs ({target.steps} steps, an eval every 1%)")
    t0 = time.perf_counter()
    false = {"1 metric": 0, f"{m} metrics, Sidak": 0, f"{m} metrics, uncorrected": 0}
    per_metric_false = 0
    kinds: dict = {name: {} for name in false}
    det = []          # evals after onset, None when missed
    named_ok = 0      # the drifting metric alone among the non-info alerts
    others_noisy = 0
    total = 0
    drift = sy.Fault("drift", 0.3, 0.03)
    for k in range(n_ladders):
        runs = [sy.make_multi_run(truths, t, noise=noise, seed=k * 100 + i)
                for i, t in enumerate(rungs)]
        tmp = Path(tempfile.mkdtemp())
        for r in runs:
            d = tmp / r.target.name
            d.mkdir()
            with open(d / "metrics.jsonl", "w") as fh:
                fh.writelines(json.dumps(row) + "\n" for row in r.rows)
        singles, sidak = {}, {}
        for key in keys:
            pts = sy.points_table(runs, metric=key)
            keep = (np.rint(pts["fraction"] * 100).astype(int) % 5 == 0)
            from ladder.fit import fit_law
            if args.truth_law:
                law = dataclasses.replace(sy.TruthLaw(truths[key], run_sigma=noise.run_sigma),
                                          metric=key)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    law = fit_law(pts[keep].reset_index(drop=True), form="trajectory",
                                  bootstrap=args.bootstrap, metric=key, backtest=False, seed=k)
            with contextlib.redirect_stderr(io.StringIO()):
                singles[key] = make_prereg(law, target, level=0.9, runs=str(tmp), config=base)
                sidak[key] = make_prereg(law, target, level=0.9, runs=str(tmp), config=fam_cfg)
        doc_sidak = pr.build_multi(sidak, family=rec)
        _, rec_none = family_config(base, 1)
        doc_none = pr.build_multi(singles, family=rec_none)
        doc_one = singles[keys[0]]
        for s in range(n_healthy):
            seed = 10_000 + 1000 * k + s
            rows = sy.make_multi_run(truths, target, noise=noise, seed=seed).rows
            total += 1
            one_rows = [{**r, "eval_dropless/loss": r[keys[0]]} if keys[0] in r else r
                        for r in rows]
            for name, doc, rr in (("1 metric", doc_one, one_rows),
                                  (f"{m} metrics, Sidak", doc_sidak, rows),
                                  (f"{m} metrics, uncorrected", doc_none, rows)):
                res = check(doc, rr, None, now=0)
                bad = [a for a in res.alerts if a.severity != "info"]
                false[name] += bool(bad)
                for a in bad:
                    kinds[name][a.kind] = kinds[name].get(a.kind, 0) + 1
                if name.endswith("uncorrected"):
                    per_metric_false += len({a.extra.get("metric") for a in bad
                                             if a.extra.get("metric")})
            if s < max(3, n_healthy // 3):
                bad_key = keys[s % m]
                rows_f = sy.make_multi_run(truths, target, noise=noise, seed=seed,
                                           faults={bad_key: drift}).rows
                res = check(doc_sidak, rows_f, None, now=0)
                bad = [a for a in res.alerts if a.severity != "info"]
                hit = [a for a in bad if a.extra.get("metric") == bad_key]
                onset = math.ceil(drift.at * target.steps)
                det.append(None if not hit else (hit[0].step - onset) / (target.steps / 100))
                others = {a.extra.get("metric") for a in bad} - {bad_key}
                others_noisy += bool(others)
                named_ok += bool(hit) and not others
    print(f"\nfamily-wise false alarms on {total} healthy target runs  "
          f"[{time.perf_counter() - t0:.0f} s]")
    out = {"metrics": m, "healthy_runs": total, "alert_level": base.alert_level,
           "sidak_alert_level": fam_cfg.alert_level, "fwer": {}}
    for name, n in false.items():
        lo, hi = _wilson(n, total)
        print(f"   {name:<24} {n:3d} of {total} runs ({n / total:.1%}, 95% CI "
              f"{lo:.1%}-{hi:.1%})")
        out["fwer"][name] = n / total
        if kinds[name]:
            print(f"      alert kinds: {kinds[name]}")
    print(f"   (uncorrected: {per_metric_false} metric-alarms in all, "
          f"{per_metric_false / (total * m):.2%} per metric and run)")
    got = [x for x in det if x is not None]
    print(f"\none metric drifting to +3% (30%->end) among {m}, Sidak rule: caught {len(got)}/"
          f"{len(det)}, latency median {np.median(got) if got else math.nan:.1f} evals; named "
          f"alone (no other metric alarmed) {named_ok}/{len(det)}; runs where another metric "
          f"alarmed {others_noisy}/{len(det)}")
    out["drift_detection"] = {"caught": len(got), "runs": len(det),
                              "median_evals": float(np.median(got)) if got else None,
                              "named_alone": named_ok, "others_alarmed": others_noisy}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return math.nan, math.nan
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


if __name__ == "__main__":
    sys.exit(main())
