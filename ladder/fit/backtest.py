"""Backtests: fit on the smaller runs, predict the larger ones.

Runs are ordered by scale (their largest compute; else params x tokens; else params) and grouped
into scale levels of 0.05 decades (one IsoFLOP budget, or a rung and its rerun, is held out
together). Rollout: for each of the last ``max_folds`` levels, fit on every smaller level and
predict that level; its last fold is leave-the-largest-out. Errors are relative, ``predicted /
observed - 1``, at the held-out runs' final points and averaged over their whole curves.

The folds also measure the extrapolation error (the band's term,
fit.result.FitResult.extrapolation_log_sd): a held-out final point's distance d is its most
decades outside the training runs' range over the form's inputs (a bigger model at an inside
budget is outside in params); the rate per decade pools the log errors e of the points outside,
r^2 = sum(e^2) / sum(d^2) (the moment estimate for e ~ N(0, r^2 d^2)), so a fold 0.09 decades
out does not divide its error by 0.09 (OLMo: 7%/decade; docs/LOG.md 2026-12-01).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd

from ladder.fit.config import FitConfig
from ladder.fit.estimate import fit_by, fit_spec, run_scales, select_points
from ladder.fit.forms import Spec, get_form
from ladder.fit.lawjson import LOG_SPREAD_LIMIT
from ladder.fit.result import input_distance
from ladder.io import InputError

MAX_FOLDS = 4
EXTRAPOLATION_METHOD = ("held-out log errors pooled per decade (sum e^2 / sum d^2) of the largest "
                        "distance outside the fitted range in the form's inputs")
PLANNED = ("tokens", "compute")  # so far at a point: divided by its fraction (planned, at 1)
# The extrapolation error outside the fitted runs: log sd = s d^p, s^2 = sum(e^2) / sum(d^(2p))
# (p = 1: the rate above; p = 0: the RMS held-out error wherever a point is outside). p = 0 was
# chosen by every ladder's others on bench/scoreboard.py leave-one-ladder-out over 0..1 in steps
# of 0.25 (docs/LOG.md 2026-12-07: held-out errors do not grow with distance). For --form auto
# only (fit.law.fit_law's ``extrapolation_power``); a named form keeps p = 1 unless asked.
EXTRAPOLATION_POWER = 0.0


def scale_inputs(form, params_column: str = "params") -> list[str]:
    """The form's input columns (``N`` is ``params_column``) but ``fraction``, once each."""
    return list(dict.fromkeys(params_column if need == "N" else need for need in form.needs
                              if need != "fraction"))


def _planned(df: pd.DataFrame, col: str) -> np.ndarray:
    v = df[col].to_numpy(dtype=float)
    if col in PLANNED and "fraction" in df.columns and df["fraction"].notna().all():
        v = v / np.clip(df["fraction"].to_numpy(dtype=float), 1e-12, None)
    return v


def input_ranges(df: pd.DataFrame, cols) -> dict:
    """{column: [log10 min, log10 max]} of the planned values of the ``cols`` the table has."""
    out = {}
    for c in cols:
        if c in df.columns and df[c].notna().all() and len(df):
            with np.errstate(divide="ignore", invalid="ignore"):
                lv = np.log10(_planned(df, c))
            lv = lv[np.isfinite(lv)]
            if lv.size:
                out[c] = [float(lv.min()), float(lv.max())]
    return out


def _outside(folds):
    """(e, d) of the folds' held-out points outside their fold's range."""
    for f in folds or []:
        if isinstance(f, dict):
            for e, d in zip(f.get("log_err") or [], f.get("distance") or [], strict=False):
                if all(isinstance(x, (int, float)) and math.isfinite(x) for x in (e, d)) \
                        and d > 0:
                    yield e, d


def pooled_rate(folds) -> tuple[float | None, int]:
    """(r, points outside): r^2 = sum(e^2) / sum(d^2) (module docstring); r None without any."""
    pts = list(_outside(folds))
    if not pts:
        return None, 0
    return math.sqrt(sum(e * e for e, _ in pts) / sum(d * d for _, d in pts)), len(pts)


def pooled_scale(folds, power: float) -> float | None:
    """s of the extrapolation term s d^power: s^2 = sum(e^2) / sum(d^(2 power)); None without
    a point outside."""
    pts = list(_outside(folds))
    d2 = sum(d ** (2 * power) for _, d in pts)
    return math.sqrt(sum(e * e for e, _ in pts) / d2) if d2 > 0 else None


def hold(ex: dict, key: str, value: float | None) -> None:
    """``ex[key] = value``, held at law.json's limit on a band's spread (lawjson.LOG_SPREAD_LIMIT,
    which its reader checks) when the folds measured more (11.6 per decade from a fold on a few
    flat runs). At the limit the band is already e^+-16 at 90% one decade out, so holding changes
    no judgement; the measured value is kept in ``held_at_limit`` (not read by the band)."""
    held = dict(ex.get("held_at_limit") or {})
    held.pop(key, None)
    if value is not None and value > LOG_SPREAD_LIMIT:
        held[key] = float(value)
        value = LOG_SPREAD_LIMIT
    ex[key] = value
    if held:
        ex["held_at_limit"] = held
    else:
        ex.pop("held_at_limit", None)


def with_power(bt, power: float):
    """A new backtest record on the power model s d^power (a record without the pooled
    extrapolation record as it is)."""
    ex = bt.get("extrapolation") if isinstance(bt, dict) else None
    if not (isinstance(ex, dict) and "ranges_log10" in ex):
        return bt
    ex = dict(ex, power=float(power))
    hold(ex, "log_sd_scale", pooled_scale(bt.get("folds"), float(power)))
    along = along_curve(bt.get("folds"))
    if along is not None:
        ex["along_curve"] = along
    return dict(bt, extrapolation=ex)


def along_curve(folds) -> dict | None:
    """The RMS log error of the held-out runs' evals along their curves per fraction (0.01):
    {"fraction", "log_sd", "method"} for the band of a run's early part; None without any."""
    by: dict = {}
    for f in folds or []:
        if not isinstance(f, dict):
            continue
        for g, e in zip(f.get("along_fraction") or [], f.get("along_log_err") or [],
                        strict=False):
            if isinstance(g, (int, float)) and isinstance(e, (int, float)) and \
                    math.isfinite(g) and math.isfinite(e):
                by.setdefault(round(float(g), 2), []).append(float(e))
    if not by:
        return None
    gs = sorted(by)
    return {"fraction": gs, "log_sd": [math.sqrt(float(np.mean(np.square(by[g])))) for g in gs],
            "method": "RMS log error of the rollout's held-out runs along their curves, per "
                      "fraction (0.01), where a law of final points predicts their evals"}


def scale_levels(df: pd.DataFrame) -> pd.Series:
    """Every run's scale level: log10 of its scale (:func:`run_scales`) in 0.05 decades."""
    logs, _ = run_scales(df)
    return pd.Series(np.round(logs * 20).astype(int), index=logs.index)


def backtest(df: pd.DataFrame, spec, config: FitConfig, *, by: str | None = None,
             final_only: bool | None = None, max_folds: int = MAX_FOLDS,
             starts=None) -> dict:
    logs, kind = run_scales(df)
    levels = scale_levels(df)
    cols = scale_inputs(spec.form, config.params_column)
    config = config.refit()  # the folds' refits: no bootstrap, no backtest
    uniq = np.sort(levels.unique())
    folds, skipped = [], []
    for lv in uniq[max(1, len(uniq) - max_folds):]:
        train_runs = levels.index[levels < lv]
        test_runs = levels.index[levels == lv]
        train = df[df["run"].isin(train_runs)].copy()
        test = df[df["run"].isin(test_runs)].copy()
        train.attrs = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if by is not None:
                    res = fit_by(train, spec, by, config)
                else:
                    res = fit_spec(train, spec, config, final_only=final_only, starts=starts)
        except InputError as e:
            skipped.append({"train_runs": len(train_runs), "reason": str(e)})
            continue
        fold = _evaluate(res, test, spec, by, final_only, len(train_runs),
                         input_ranges(train, cols))
        # how far this fold extrapolated: decades from the largest training run to the held-out
        fold["decades"] = float(logs[test_runs].max() - logs[train_runs].max())
        folds.append(fold)
    out = {"method": "rollout by scale level (0.05 decades); leave-largest-out = last fold",
           "folds": folds, "skipped": skipped, "scale": kind,
           "scale_log10_max": float(logs.max()), "scale_log10_min": float(logs.min())}
    out["extrapolation"] = {"method": EXTRAPOLATION_METHOD, "inputs": cols,
                            "ranges_log10": input_ranges(df, cols)}
    if "compute" not in cols:  # a larger run is outside in compute even inside every input
        out["extrapolation"]["scale_ranges_log10"] = input_ranges(df, ["compute"])
    return summarise_folds(out)


def summarise_folds(out: dict) -> dict:
    """Fill a backtest record's summaries from its ``folds`` (in place; returned)."""
    folds = out["folds"]
    rate, n_out = pooled_rate(folds)
    ex = out["extrapolation"] = dict(out.get("extrapolation") or {}, rate_per_decade=None,
                                     n_points=n_out)
    hold(ex, "rate_per_decade", rate)
    if "power" in ex:  # the power model's scale follows the folds (with_power)
        hold(ex, "log_sd_scale", pooled_scale(folds, ex["power"]))
    for key in ("rollout_mean_abs_final", "rollout_mean_abs_curve", "leave_largest_out",
                "band_coverage_final"):
        out.pop(key, None)
    if folds:
        fin = np.concatenate([f["final_rel_err"] for f in folds])
        out["rollout_mean_abs_final"] = float(np.mean(np.abs(fin)))
        curve = [f["curve_mean_abs_rel_err"] for f in folds if f["curve_mean_abs_rel_err"]
                 is not None]
        out["rollout_mean_abs_curve"] = float(np.mean(curve)) if curve else None
        last = folds[-1]
        out["leave_largest_out"] = {"held_out": last["held_out"],
                                    "final_rel_err": last["final_rel_err"],
                                    "mean_abs_final": float(np.mean(np.abs(
                                        last["final_rel_err"]))),
                                    "curve_mean_abs_rel_err": last["curve_mean_abs_rel_err"]}
        cov = [f["inside_band"] for f in folds if f["inside_band"] is not None]
        out["band_coverage_final"] = float(np.mean(cov)) if cov else None
    return out


def _evaluate(res, test, spec, by, final_only, n_train, ranges=None) -> dict:
    final_pts, _ = select_points(test, spec.form, True)
    curve_pts = test if (by is not None or spec.form.curves) else None
    if by is not None:  # per-fraction laws predict only inside their fitted fraction range
        lo = min(v for v, _ in res.groups) - 5e-4
        hi = max(v for v, _ in res.groups) + 5e-4
        curve_pts = test[(test["fraction"] >= lo) & (test["fraction"] <= hi)]
        final_pts = final_pts[(final_pts["fraction"] >= lo) & (final_pts["fraction"] <= hi)]
    fin = _predict(res, final_pts)
    y = final_pts["loss"].to_numpy(dtype=float)
    rel = fin.loss / y - 1.0
    inside = None
    if np.all(np.isfinite(fin.lo)):
        inside = float(np.mean((y >= fin.lo) & (y <= fin.hi)))
    # the extrapolation record: log error and decades outside the fold's training range
    loge = np.log(fin.loss / y)
    dist = input_distance({c: _planned(final_pts, c) for c in (ranges or {})}, ranges or {},
                          (len(final_pts),))
    curve_err = None
    if curve_pts is not None and len(curve_pts):
        cp = _predict(res, curve_pts)
        curve_err = float(np.mean(np.abs(cp.loss / curve_pts["loss"].to_numpy() - 1.0)))
    along = {}
    if by is None and not spec.form.curves and "fraction" in test.columns:
        # the error of a run's early part, which no final point measures (along_curve)
        mid = test[test["fraction"].notna() & (test["fraction"] < 1 - 1e-9)]
        if len(mid):
            mp = _predict(res, mid)
            le = np.log(mp.loss / mid["loss"].to_numpy(dtype=float))
            ok = np.isfinite(le)
            along = {"along_fraction": [float(x) for x in mid["fraction"].to_numpy()[ok]],
                     "along_log_err": [float(x) for x in le[ok]]}
    return {**along, "train_runs": int(n_train),
            "held_out": sorted(final_pts["run"].astype(str)),
            # the run of each final_rel_err / log_err / distance, in their order
            "final_runs": [str(x) for x in final_pts["run"]],
            "final_rel_err": [float(x) for x in rel],
            "final_mean_abs": float(np.mean(np.abs(rel))) if len(rel) else None,
            "curve_mean_abs_rel_err": curve_err, "inside_band": inside,
            "log_err": [float(x) for x in loge], "distance": [float(x) for x in dist]}


def _predict(res, pts):
    kw = {}
    for col in ("params", "active_params", "tokens", "compute", "fraction"):
        if col in pts.columns and pts[col].notna().all():
            kw[col] = pts[col].to_numpy(dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return res.predict(**kw)


def trajectory_vs_per_fraction(df: pd.DataFrame, config: FitConfig, *,
                               traj_bt: dict | None = None,
                               per_fraction_bt: dict | None = None, E: float = 1.5) -> dict:
    """Backtest the trajectory law against the real ladder's method (a compute law per
    fraction, E fixed: Marin's 1.5) on the same held-out rungs; which predicts them better."""
    o = config.refit()
    if traj_bt is None:  # the trajectory law is always the summed-Huber fit, no prior
        traj_bt = backtest(df, Spec(get_form("trajectory")),
                           replace(o, objective="huber", prior={}), final_only=False)
    if per_fraction_bt is None:
        per_fraction_bt = backtest(df, Spec(get_form("compute"), fix={"E": E}), o,
                                   by="fraction")
    label_pf = f"per-fraction compute (E={E:g})"
    # compare on the folds both methods could fit (the same held-out rungs)
    common = {tuple(f["held_out"]) for f in traj_bt.get("folds", [])} & \
        {tuple(f["held_out"]) for f in per_fraction_bt.get("folds", [])}

    def summary(bt):
        folds = [f for f in bt.get("folds", []) if tuple(f["held_out"]) in common]
        if not folds:
            return {"final": None, "curve": None}
        fin = np.concatenate([np.abs(f["final_rel_err"]) for f in folds])
        curve = [f["curve_mean_abs_rel_err"] for f in folds
                 if f["curve_mean_abs_rel_err"] is not None]
        return {"final": float(np.mean(fin)) if fin.size else None,
                "curve": float(np.mean(curve)) if curve else None}

    out = {"trajectory": summary(traj_bt), label_pf: summary(per_fraction_bt),
           "held_out": sorted(r for held in common for r in held)}
    t, p = out["trajectory"], out[label_pf]
    key = "curve" if t["curve"] is not None and p["curve"] is not None else "final"
    if t[key] is not None and p[key] is not None:
        out["better"] = "trajectory" if t[key] < p[key] else label_pf
        out["criterion"] = f"rollout mean |relative error| over held-out {key} points"
    out["folds"] = {"trajectory": traj_bt.get("folds", []),
                    label_pf: per_fraction_bt.get("folds", [])}
    return out


def fit_one(df: pd.DataFrame, spec, config: FitConfig | None = None):
    """fit.estimate.fit_spec and, with ``config.backtest``, its ``diagnostics["backtest"]`` (a
    curve form's also ``trajectory_vs_per_fraction``)."""
    config = config or FitConfig()
    res = fit_spec(df, spec, config)
    if not config.backtest:
        return res
    bt = backtest(df, spec, res.config, starts=res.starts)
    if not (spec.form.curves and config.objective == "huber"):
        return res.with_diagnostics(backtest=bt)
    return res.with_diagnostics(backtest=bt, trajectory_vs_per_fraction=trajectory_vs_per_fraction(
        df, replace(config, prior={}, bandwidth=None), traj_bt=bt, E=float(spec.fix.get("E", 1.5))))
