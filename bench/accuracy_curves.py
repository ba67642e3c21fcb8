"""Accuracy rows for the schedule-aware curve laws (fit.curve_fit) against published loss curves.

Each row function takes the anchors folder and returns a dict: ``name``, ``value`` (the measured
number), ``target`` (what it must be, in words), ``passed`` (bool), ``published`` (the authors'
number, when there is one), ``detail``; or ``{"name", "skipped": reason}`` when the anchor data
is absent. ``ROWS`` lists them for ``bench/accuracy.py``.

    python bench/accuracy_curves.py [--anchors ../shared/anchors] [--form mpl|momentum]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_ANCHORS = REPO.parent / "shared" / "anchors"

# Luo et al. 2025 (anchors/multipower_luo2025/README.md, from the authors' src/config.py): fit on
# these 3 schedules, predict the 6 others; their mean relative errors per model size.
LUO_TRAIN = ("cosine_24000", "constant_24000", "wsdcon_9")
LUO_TEST = ("constant_72000", "cosine_72000", "wsd_20000_24000", "wsdld_20000_24000",
            "wsdcon_3", "wsdcon_18")
LUO_PUBLISHED = {"25M": 0.00110, "100M": 0.00142, "400M": 0.00168}
LUO_MAX_ERROR = 0.002   # issue #6: at most 0.2% mean relative error per model size


def _luo_run(folder: Path, name: str):
    import pandas as pd

    d = pd.read_csv(folder / f"{name}.csv")
    d["run"] = name
    return d


LUO_BOOTSTRAP = 200      # issue 13: one size with 200 bootstrap replicates in <= 15 s on 2 cores
LUO_MAX_SECONDS = 15.0


def luo_multipower(anchors: Path, form: str = "mpl", sizes=("25M", "100M", "400M"),
                   bootstrap: int = LUO_BOOTSTRAP) -> dict:
    """MPL fitted on the authors' 3 training schedules predicts the 6 others (per size).

    The LR of every update comes from the ``lr`` column sampled every 128 steps (linearly
    interpolated, linear warmup from 0 before the first sample: fit.lr_schedules), not from the
    authors' schedule code. Error: mean over the 6 test curves of the mean |pred - loss| / loss
    over each curve's logged points (the authors' metric). Each size is fitted with
    ``bootstrap`` run-level replicates and timed (wall and CPU seconds of ``fit_curve_law``;
    the table has no size column: one size needs none)."""
    import pandas as pd

    from ladder.fit.curve_fit import fit_curve_law
    from ladder.fit.lr_schedules import lr_from_samples

    name = f"luo2025_{form}_holdout_schedules"
    root = Path(anchors) / "multipower_luo2025"
    if not root.is_dir():
        return {"name": name, "skipped": f"{root} not found"}
    per_size, worst = {}, 0.0
    t0 = time.perf_counter()
    for size in sizes:
        folder = root / f"csv_{size}"
        train = pd.concat([_luo_run(folder, n) for n in LUO_TRAIN], ignore_index=True)
        w0, c0 = time.perf_counter(), time.process_time()
        law = fit_curve_law(train, form, bootstrap=bootstrap)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        errs = {}
        for n in LUO_TEST:
            d = _luo_run(folder, n)
            lr = lr_from_samples(d["step"], d["lr"])
            pred = law.predict(schedule=lr, step=d["step"].to_numpy(), level=0.9)
            errs[n] = float(np.mean(np.abs(pred.loss - d["loss"]) / d["loss"]))
        mean = float(np.mean(list(errs.values())))
        per_size[size] = {"mean_rel_error": mean, "per_schedule": errs,
                          "published": LUO_PUBLISHED.get(size), "params": law.params,
                          "fit_seconds": wall, "fit_cpu_seconds": cpu,
                          "bootstrap_draws": len(law.draws)}
        worst = max(worst, mean)
    summary = ", ".join(f"{s} {100 * v['mean_rel_error']:.3f}% (authors "
                        f"{100 * v['published']:.3f}%; fit with {v['bootstrap_draws']} "
                        f"bootstrap draws {v['fit_seconds']:.1f} s wall, "
                        f"{v['fit_cpu_seconds']:.1f} s CPU)" for s, v in per_size.items())
    return {"name": name, "value": worst, "target": f"mean relative error <= "
            f"{100 * LUO_MAX_ERROR:.1f}% for every size", "passed": worst <= LUO_MAX_ERROR,
            "published": {s: v["published"] for s, v in per_size.items()},
            "detail": {"summary": summary, "per_size": per_size,
                       "seconds": time.perf_counter() - t0}}


# Schaipp et al. 2025 (anchors/schaipp2025_lr_schedules): 124M Llama, WSD with linear cooldown to
# 0 over the last f of the run (warmup 300), at several horizons and peak LRs, plus the constant
# LR run of each peak LR. The curves of the WSD runs cover their cooldown only (they branch off the
# constant run), so the LR of every update is rebuilt from runs.csv (ladder.specs.Schedule "wsd").
SCHAIPP_FIT_HORIZON = 15000  # the shortest horizon: fit there, predict the longer ones
SCHAIPP_MIN_STEP = 2000  # fit from here: the laws describe the curve after the early transient
                         # (Luo et al.'s curves also start after warmup)
SCHAIPP_TIE = 0.002     # measured final losses closer than this (absolute) count as tied:
                        # differences this small are within seed-to-seed noise of 124M runs


def _wsd_lr(iterations: int, warmup: int, peak: float, fract: float) -> np.ndarray:
    from ladder.fit.lr_schedules import lr_from_schedule
    from ladder.specs import Schedule

    sched = Schedule(kind="wsd" if fract > 0 else "constant", warmup=warmup / iterations,
                     min_lr_frac=0.0, decay=fract)
    return lr_from_schedule(sched, iterations, peak)


def schaipp_cooldown_order(anchors: Path, form: str = "mpl", peak: float = 0.001,
                           fit_horizon: int = SCHAIPP_FIT_HORIZON) -> dict:
    """Fit on a short-horizon sweep -- the constant-LR run up to ``fit_horizon`` steps and the
    cooldowns of every fraction at that horizon -- and predict the final loss of every cooldown
    fraction at each longer horizon (25k, 35k, 50k steps); compare the order with the measured
    final validation losses. Pass: at every predicted horizon, every pair of fractions whose
    measured gap exceeds SCHAIPP_TIE is ordered the same way (closer pairs are ties in the data).

    (A first protocol, constant run + only f=0.2 at 25k, got the order wrong at every horizon:
    one cooldown does not pin down how the annealing gain grows with cooldown length. With this
    protocol, measured here for MPL: peak LR 5e-4 0 discordant of 41 pairs, 1e-3 0 of 39, 2e-3
    5 of 38 -- at the highest LR even the fitted 15k horizon is misordered; momentum law at 1e-3:
    18 of 39.)"""
    import pandas as pd

    from ladder.fit.curve_fit import fit_curve_law

    name = f"schaipp2025_{form}_cooldown_order"
    root = Path(anchors) / "schaipp2025_lr_schedules"
    if not root.is_dir():
        return {"name": name, "skipped": f"{root} not found"}
    runs = pd.read_csv(root / "runs.csv")
    curves = pd.read_csv(root / "curves.csv.gz")
    is124 = runs["file"].str.contains("nlayers12_nhead12") & (runs["lr"] == peak) \
        & runs["dataset"].eq("slimpajama")
    stable = runs[is124 & runs["file"].str.startswith("stable-")]
    wsd = runs[is124 & runs["file"].str.startswith("ann124-") & runs["decay_type"].eq("linear")]
    if stable.empty or wsd.empty:
        return {"name": name, "skipped": "constant or WSD runs missing in runs.csv"}
    fit_rows = [stable.iloc[0]] + [r for _, r in wsd.iterrows()
                                   if r["iterations"] == fit_horizon]
    frames, scheds = [], {}
    for r in fit_rows:
        v = curves[(curves["run_id"] == r["run_id"]) & (curves["split"] == "val")]
        v = v[(v["iter"] >= SCHAIPP_MIN_STEP) & (v["iter"] <= fit_horizon)]
        frames.append(pd.DataFrame({"run": str(r["run_id"]), "step": v["iter"].to_numpy(),
                                    "loss": v["loss"].to_numpy()}))
        fract = 0.0 if str(r["file"]).startswith("stable-") else float(r["wsd_fract_decay"])
        scheds[str(r["run_id"])] = _wsd_lr(int(r["iterations"]), int(r["warmup_steps"]),
                                           peak, fract)
    table = pd.concat(frames, ignore_index=True)
    t0 = time.perf_counter()
    law = fit_curve_law(table, form, bootstrap=0, schedules=scheds)
    groups, ok_all, n_pairs, n_bad, exact = {}, True, 0, 0, 0
    for iters, g in wsd.groupby("iterations"):
        g = g.sort_values("wsd_fract_decay")
        fr = g["wsd_fract_decay"].to_numpy(float)
        meas = g["final_val_loss"].to_numpy(float)
        pred = np.array([law.predict(schedule=_wsd_lr(int(iters), 300, peak, f),
                                     step=[int(iters)]).loss[0] for f in fr])
        bad = []
        for i in range(len(fr)):
            for j in range(i + 1, len(fr)):
                if abs(meas[i] - meas[j]) <= SCHAIPP_TIE:
                    continue
                if iters != fit_horizon:
                    n_pairs += 1
                if np.sign(meas[i] - meas[j]) != np.sign(pred[i] - pred[j]):
                    bad.append((float(fr[i]), float(fr[j])))
        same = list(fr[np.argsort(meas)]) == list(fr[np.argsort(pred)])
        if iters != fit_horizon:       # the fitted horizon is in-sample: reported, not judged
            n_bad += len(bad)
            exact += same
            ok_all &= not bad
        groups[int(iters)] = {"fractions": fr.tolist(), "measured": meas.tolist(),
                              "predicted": pred.tolist(), "in_sample": iters == fit_horizon,
                              "measured_order": fr[np.argsort(meas)].tolist(),
                              "predicted_order": fr[np.argsort(pred)].tolist(),
                              "exact_order": same, "discordant_pairs": bad}
    n_pred = sum(not g["in_sample"] for g in groups.values())
    return {"name": name, "value": n_bad, "target": f"0 discordant pairs among pairs whose "
            f"measured final losses differ by > {SCHAIPP_TIE}, at every predicted horizon",
            "passed": bool(ok_all) and n_pred > 0,
            "published": "qualitative: ordering of final losses across cooldown fractions",
            "detail": {"pairs_compared": n_pairs,
                       "predicted_horizons_with_exact_order": f"{exact}/{n_pred}",
                       "groups": groups, "peak_lr": peak,
                       "fit_on": [f"constant LR to {fit_horizon}",
                                  f"all cooldown fractions at {fit_horizon}"],
                       "params": law.params, "seconds": time.perf_counter() - t0}}


ROWS = [luo_multipower, schaipp_cooldown_order]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchors", default=str(DEFAULT_ANCHORS))
    ap.add_argument("--form", default="mpl", choices=["mpl", "momentum"])
    args = ap.parse_args(argv)
    failed = 0
    import warnings

    warnings.filterwarnings("ignore", message="curve law has no bootstrap draws")
    for row in ROWS:
        r = row(Path(args.anchors), form=args.form)
        if "skipped" in r:
            print(f"{r['name']}: skipped ({r['skipped']})")
            continue
        failed += not r["passed"]
        d = r["detail"]
        print(f"{r['name']}: {'PASS' if r['passed'] else 'FAIL'} value={r['value']} "
              f"target: {r['target']}")
        if "summary" in d:
            print(f"  {d['summary']}")
        for k, g in d.get("groups", {}).items():
            print(f"  {k} steps{' (fitted)' if g['in_sample'] else ''}: measured order "
                  f"{g['measured_order']} predicted {g['predicted_order']} discordant "
                  f"{g['discordant_pairs']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
