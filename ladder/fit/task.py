"""Downstream accuracy in two steps (``--form task --via LOSS_KEY``): Bhagia et al. 2024,
"Establishing Task Scaling Laws via Compute-Efficient Model Ladders" (arXiv:2412.04403).

Both steps are ``fit.law.fit_task``. Step 1 fits the task's loss with ``fit.law.fit_law`` (any
form, its bootstrap and band), one point per run: its last ``smooth`` evals averaged
(:func:`step1_table`). Step 2 maps task loss to accuracy with the paper's sigmoid (eq. 2, as in
src/scaling/fitting_functions.py at commit 67a3f44 of github.com/allenai/OLMo-ladder):

    acc(L) = a / (1 + exp(-k (L - L0))) + b,   a in [-1, 0], k >= 0, b in [0, 1]

fitted, as in the paper, to every eval after each run's first ``skip`` (10%), smoothed by a
moving average of ``smooth`` (5), plus the point (L = 0, acc = 1); by scipy's bounded least
squares from a grid of starts (our own code).

Band (``TaskLaw.predict``), Monte Carlo over both steps: draws of the task loss from step 1's
band (a split normal in log loss), each through one run-level bootstrap draw of the sigmoid,
plus a resampled step-2 residual, plus the sigmoid's extrapolation error below its lowest fitted
loss (sd = rate x distance, the rate from a rollout of step 2 over the ladder's sizes).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from ladder.fit.solver import run_weights
from ladder.fit.task_law import (ANCHOR, LOWER, NAMES, SKIP, SMOOTH, UPPER, TaskLaw,
                                  sigmoid)
from ladder.io import InputError


def fit_sigmoid(L, acc, weights=None, *, anchor=ANCHOR, starts=None) -> np.ndarray:
    """(a, L0, k, b) by weighted least squares of accuracy, within the paper's bounds, the best
    of a grid of starts (or of ``starts``). ``anchor`` (L, acc) is added with weight 1."""
    L = np.asarray(L, dtype=float)
    acc = np.asarray(acc, dtype=float)
    w = np.ones_like(L) if weights is None else np.asarray(weights, dtype=float)
    if anchor is not None:
        L, acc, w = np.append(L, anchor[0]), np.append(acc, anchor[1]), np.append(w, 1.0)
    sw = np.sqrt(w)

    def res(p):
        return sw * (sigmoid(L, *p) - acc)

    if starts is None:
        lo_acc = float(np.min(acc))
        starts = [np.array([min(lo_acc - 1.0, -1e-3), L0, k, 1.0])
                  for L0 in np.quantile(L, [0.2, 0.5, 0.8]) for k in (1.0, 3.0, 10.0)]
    best, best_cost = None, math.inf
    for p0 in starts:
        p0 = np.clip(np.asarray(p0, dtype=float), LOWER + 1e-9,
                     np.where(np.isfinite(UPPER), UPPER - 1e-9, 1e9))
        r = least_squares(res, p0, bounds=(LOWER, UPPER), method="trf", x_scale="jac",
                          max_nfev=2000)
        if r.cost < best_cost:
            best, best_cost = r.x, r.cost
    return best


def step1_table(df: pd.DataFrame, via: str, metric: str, *, smooth: int = SMOOTH,
                skip: float = SKIP, where: str = "<table>") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step 1's points table of ``via`` and step 2's (loss, accuracy) pairs, checked, from a
    table of evals: one row per (run, eval) with ``run``, ``params`` (and/or ``active_params``,
    ``compute``), ``tokens`` and the columns ``via`` (task loss) and ``metric`` (accuracy in
    [0, 1])."""
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise InputError(f"must be an integer >= 1, got {smooth!r}", field="smooth")
    if not 0 <= skip < 1:
        raise InputError(f"must be in [0, 1), got {skip!r}", field="skip")
    for col in ("run", "tokens", via, metric):
        if col not in df.columns:
            raise InputError(f"missing column (columns: {', '.join(map(str, df.columns))})",
                             path=where, field=col)
    d = df.copy()
    for col in (via, metric, "tokens"):
        v = pd.to_numeric(d[col], errors="coerce")
        if v.isna().any():
            i = int(np.flatnonzero(v.isna().to_numpy())[0])
            raise InputError(f"row {i + 1}: not a number ({d[col].iat[i]!r})", path=where,
                             field=col)
        d[col] = v.astype(float)
    acc = d[metric].to_numpy()
    bad = np.flatnonzero((acc < 0) | (acc > 1))
    if len(bad):
        raise InputError(f"row {bad[0] + 1}: accuracy {acc[bad[0]]!r} outside [0, 1]",
                         path=where, field=metric)
    loss = d[via].to_numpy()
    bad = np.flatnonzero(~np.isfinite(loss) | (loss <= 0))
    if len(bad):
        raise InputError(f"row {bad[0] + 1}: task loss {loss[bad[0]]!r} must be a finite "
                         "positive number", path=where, field=via)
    size_cols = [c for c in ("params", "active_params", "compute") if c in d.columns]
    if not size_cols:
        raise InputError("needs params (or active_params, or compute)", path=where,
                         field="params")
    step1, pairs = [], []
    for run, g in d.groupby("run", sort=False):
        g = g.sort_values("tokens")
        n = len(g)
        tail = g.iloc[-min(smooth, n):]
        last = g.iloc[-1]
        step1.append({"run": str(run), "tokens": float(last["tokens"]), "fraction": 1.0,
                      "loss": float(tail[via].mean()), **{c: float(last[c]) for c in size_cols}})
        kept = g.iloc[int(math.ceil(skip * n)):]
        w = min(smooth, len(kept))
        if w < 1:
            continue
        kern = np.ones(w) / w
        xs = np.convolve(kept[via].to_numpy(), kern, mode="valid")
        ys = np.convolve(kept[metric].to_numpy(), kern, mode="valid")
        size = float(last[size_cols[0]])
        pairs += [{"run": str(run), "size": size, "loss": x, "acc": y,
                   "final": i == len(xs) - 1} for i, (x, y) in enumerate(zip(xs, ys,
                                                                               strict=True))]
    t1, pairs = pd.DataFrame(step1), pd.DataFrame(pairs)
    if len(pairs) < len(NAMES) + 1:
        raise InputError(f"{len(pairs)} (loss, accuracy) points after skipping and smoothing: "
                         "too few for the sigmoid's 4 parameters", path=where, field=metric)
    t1.attrs["source"] = where
    return t1, pairs


def extrapolation_rate(pairs: pd.DataFrame, anchor=ANCHOR) -> dict:
    """Step 2's rollout backtest: each size from the third up predicted from the smaller ones;
    rate sqrt(sum e^2 / sum d^2), d the distance below the fitted losses (0 without any)."""
    sizes = np.sort(pairs["size"].unique())
    errs, dists, folds = [], [], []
    for s in sizes[2:]:
        train = pairs[pairs["size"] < s]
        test = pairs[(pairs["size"] == s) & pairs["final"]]
        th = fit_sigmoid(train["loss"], train["acc"], anchor=anchor)
        e = test["acc"].to_numpy() - sigmoid(test["loss"].to_numpy(), *th)
        dd = np.maximum(0.0, train["loss"].min() - test["loss"].to_numpy())
        errs += e.tolist()
        dists += dd.tolist()
        folds.append({"held_out_size": float(s), "mean_abs_err": float(np.mean(np.abs(e))),
                      "mean_distance": float(np.mean(dd))})
    errs, dists = np.asarray(errs), np.asarray(dists)
    rate = float(np.sqrt(np.sum(errs ** 2) / np.sum(dists ** 2))) \
        if len(dists) and np.sum(dists ** 2) > 0 else 0.0
    return {"rate": rate, "folds": folds,
            "rms_err": float(np.sqrt(np.mean(errs ** 2))) if len(errs) else None}


def chain(step1, t1: pd.DataFrame, pairs: pd.DataFrame, metric: str, *, bootstrap: int,
          level: float, seed: int, smooth: int, skip: float, where: str) -> TaskLaw:
    """Step 2 on the pairs of :func:`step1_table`, chained to ``step1``: the task law."""
    L, y = pairs["loss"].to_numpy(), pairs["acc"].to_numpy()
    theta = fit_sigmoid(L, y)
    resid = y - sigmoid(L, *theta)
    rng = np.random.default_rng(seed)
    boot = []
    if bootstrap:
        starts = [theta, np.array([theta[0], np.median(L), 3.0, theta[3]])]
        # run-level Bayesian bootstrap: a run's weight given to each of its points
        runs, idx = np.unique(pairs["run"].to_numpy(), return_inverse=True)
        for w in run_weights(rng, len(runs), bootstrap)[:, idx]:
            boot.append(fit_sigmoid(L, y, w, starts=starts))
    boot = np.asarray(boot).reshape(-1, len(NAMES))
    ext = extrapolation_rate(pairs) if pairs["size"].nunique() >= 3 else \
        {"rate": 0.0, "folds": [], "rms_err": None,
         "note": "fewer than 3 sizes: no rollout, no extrapolation term"}
    q = ((1 - level) / 2, (1 + level) / 2)
    intervals = {n: [float(v) for v in np.quantile(boot[:, i], q)] if len(boot) else
                 [math.nan, math.nan] for i, n in enumerate(NAMES)}
    return TaskLaw(
        via=step1.metric, metric=metric, step1=step1, theta=theta, boot_theta=boot,
        resid=resid, ext=ext, loss_range=(float(L.min()), float(L.max())), level=level,
        intervals=intervals, smooth=smooth, skip=skip,
        inputs={"n_points": int(len(pairs)), "n_runs": int(pairs["run"].nunique()),
                "step1_points": int(len(t1)), "source": where},
        diagnostics={"step2_rms_residual": float(np.sqrt(np.mean(resid ** 2))),
                     "step2_extrapolation": ext, "step2_bootstrap": int(len(boot))})
