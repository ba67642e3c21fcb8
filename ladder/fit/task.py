"""Downstream accuracy in two steps (``--form task --via LOSS_KEY``): Bhagia et al. 2024,
"Establishing Task Scaling Laws via Compute-Efficient Model Ladders" (arXiv:2412.04403).

Step 1 fits the task's loss (the bits per byte of the correct answer, say) in params / tokens /
compute with the project's own fitter (``fit.law.fit_law``: any form, its bootstrap, backtests
and band), one point per run: its last ``smooth`` evals averaged, at its final tokens.
Step 2 maps task loss to accuracy with the paper's sigmoid (their eq. 2; the parametrisation of
their code, src/scaling/fitting_functions.py ``sigmoid`` at commit 67a3f44 of
github.com/allenai/OLMo-ladder):

    acc(L) = a / (1 + exp(-k (L - L0))) + b,   a in [-1, 0], k >= 0, b in [0, 1]

so accuracy falls from ``b`` (L -> -inf) to ``a + b`` (L -> inf) around ``L0``. As in the
paper, step 2 is fitted to every eval of every run after its first ``skip`` (10%), both
series smoothed by a moving average of ``smooth`` (5) evals, with one more point saying a model
of zero loss is always right (L = 0, acc = 1). The fitting code here is our own (scipy's
bounded least squares from a small grid of starts).

Band (``TaskLaw.predict``), Monte Carlo over both steps:
  1. the target's task loss: draws from step 1's own band at the law's level (a split normal in
     log loss whose quantiles at that level are step 1's lo and hi), which carries step 1's
     bootstrap, its residual noise and its extrapolation error (ladder.fit.result);
  2. each loss draw goes through one run-level Bayesian-bootstrap draw of the sigmoid (Dirichlet
     weights over runs: a run's checkpoints are not independent);
  3. plus a residual of step 2 (eval and checkpoint noise around the sigmoid), resampled;
  4. plus the sigmoid's own extrapolation error below the lowest loss it was fitted on: normal
     with sd = rate x (distance in loss below that lowest loss), the rate from a rollout backtest
     of step 2 over the ladder's sizes (fit on the sizes below one, predict that size's final
     accuracies from their actual losses).
The band is the draws' quantiles; the centre is the sigmoid of step 1's central loss.
"""

from __future__ import annotations

import datetime as _dt
import math
import warnings

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import ndtri

import ladder.fit.lawjson as lawjson
from ladder.fit.law import fit_law
from ladder.fit.points import load_points
from ladder.fit.prediction import Prediction, Query
from ladder.fit.report import parameter_lines
from ladder.fit.result import LawResult
from ladder.fit.solver import run_weights
from ladder.io import InputError, to_jsonable

FORM = "task"
TASK_SCHEMA = "task-law/1"   # the "task" block of a law.json file of form "task"
NAMES = ("a", "L0", "k", "b")
LOWER = np.array([-1.0, 0.0, 0.0, 0.0])
UPPER = np.array([0.0, np.inf, 1e3, 1.0])
ANCHOR = (0.0, 1.0)   # the paper's "ideal point": zero loss, every answer right
SMOOTH, SKIP = 5, 0.1  # the paper's step-2 settings (moving average 5, first 10% skipped)
N_DRAWS = 4000


def sigmoid(L, a, L0, k, b):
    """acc = a / (1 + exp(-k (L - L0))) + b (Bhagia et al. 2024, eq. 2)."""
    z = np.clip(-k * (np.asarray(L, dtype=float) - L0), -700, 700)
    return a / (1.0 + np.exp(z)) + b


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


# ----------------------------------------------------------------------------- tables


def task_tables(df: pd.DataFrame, via: str, metric: str, *, smooth: int = SMOOTH,
                skip: float = SKIP, where: str = "<table>"):
    """(step-1 points table, step-2 pairs) from a table of evals: one row per (run, eval) with
    ``run``, ``params`` (and/or ``active_params``, ``compute``), ``tokens`` and the columns
    ``via`` (task loss) and ``metric`` (accuracy in [0, 1])."""
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
        row = {"run": str(run), "tokens": float(last["tokens"]), "fraction": 1.0,
               "loss": float(tail[via].mean())}
        for c in size_cols:
            row[c] = float(last[c])
        step1.append(row)
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
    return pd.DataFrame(step1), pd.DataFrame(pairs)


# ----------------------------------------------------------------------------- fitting


def _run_weights(runs: np.ndarray, rng, replicates: int) -> np.ndarray:
    """Run-level Bayesian bootstrap (ladder.fit.solver.run_weights: Dirichlet(1) weights over runs,
    scaled to mean 1), each given to every point of its run (replicates x points)."""
    uniq, idx = np.unique(runs, return_inverse=True)
    return run_weights(rng, len(uniq), replicates)[:, idx]


def extrapolation_rate(pairs: pd.DataFrame, anchor=ANCHOR) -> dict:
    """Step 2's rollout backtest: for each size from the third up, fit the sigmoid on the smaller
    sizes and predict this size's final (smoothed) accuracies from their actual losses. The rate
    is sqrt(sum e^2 / sum d^2), e the errors and d the losses' distance below the fitted
    range's lowest loss; 0 when no held-out point lies below it."""
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


def fit_task(df: pd.DataFrame, via: str, metric: str, *, form: str = "auto",
             bootstrap: int = 200, level: float = 0.9, seed: int = 0, smooth: int = SMOOTH,
             skip: float = SKIP, where: str = "<table>", **step1_kw) -> TaskLaw:
    """Both steps on a table of evals (see :func:`task_tables`); ``form`` and ``step1_kw`` go
    to step 1's ``fit_law``."""
    if not 0 < level < 1:
        raise InputError(f"must be in (0, 1), got {level!r}", field="level")
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise InputError(f"must be an integer >= 1, got {smooth!r}", field="smooth")
    if not 0 <= skip < 1:
        raise InputError(f"must be in [0, 1), got {skip!r}", field="skip")
    t1, pairs = task_tables(df, via, metric, smooth=smooth, skip=skip, where=where)
    if len(pairs) < len(NAMES) + 1:
        raise InputError(f"{len(pairs)} (loss, accuracy) points after skipping and smoothing: "
                         "too few for the sigmoid's 4 parameters", path=where, field=metric)
    t1.attrs["source"] = where
    pts = load_points(t1, metric=via)
    step1 = fit_law(pts, form=form, bootstrap=bootstrap, level=level, seed=seed, metric=via,
                    **step1_kw)
    L, y = pairs["loss"].to_numpy(), pairs["acc"].to_numpy()
    theta = fit_sigmoid(L, y)
    resid = y - sigmoid(L, *theta)
    rng = np.random.default_rng(seed)
    boot = []
    if bootstrap:
        starts = [theta, np.array([theta[0], np.median(L), 3.0, theta[3]])]
        for w in _run_weights(pairs["run"].to_numpy(), rng, bootstrap):
            boot.append(fit_sigmoid(L, y, w, starts=starts))
    boot = np.asarray(boot).reshape(-1, len(NAMES))
    ext = extrapolation_rate(pairs) if pairs["size"].nunique() >= 3 else \
        {"rate": 0.0, "folds": [], "rms_err": None,
         "note": "fewer than 3 sizes: no rollout, no extrapolation term"}
    q = ((1 - level) / 2, (1 + level) / 2)
    intervals = {n: [float(v) for v in np.quantile(boot[:, i], q)] if len(boot) else
                 [math.nan, math.nan] for i, n in enumerate(NAMES)}
    return TaskLaw(
        via=via, metric=metric, step1=step1, theta=theta, boot_theta=boot, resid=resid,
        ext=ext, loss_range=(float(L.min()), float(L.max())), level=level,
        intervals=intervals, smooth=smooth, skip=skip,
        inputs={"n_points": int(len(pairs)), "n_runs": int(pairs["run"].nunique()),
                "step1_points": int(len(t1)), "source": where},
        diagnostics={"step2_rms_residual": float(np.sqrt(np.mean(resid ** 2))),
                     "step2_extrapolation": ext, "step2_bootstrap": int(len(boot))})


# ----------------------------------------------------------------------------- the law


class TaskLaw(LawResult, forms=(FORM,)):
    """Accuracy through task loss: step 1 (any fitted law of the loss) chained into step 2 (the
    sigmoid). ``predict`` takes step 1's inputs and returns the accuracy with its band."""

    def __init__(self, *, via: str, metric: str, step1, theta, boot_theta, resid, ext: dict,
                 loss_range, level: float, intervals: dict | None = None,
                 smooth: int = SMOOTH, skip: float = SKIP, inputs: dict | None = None,
                 diagnostics: dict | None = None, created: str | None = None,
                 tool_version: str | None = None, conventions: dict | None = None):
        self.via, self.metric, self.step1 = via, metric, step1
        self.theta = np.asarray(theta, dtype=float)
        self.boot_theta = np.asarray(boot_theta, dtype=float).reshape(-1, len(NAMES))
        self.resid = np.asarray(resid, dtype=float)
        self.ext = dict(ext)
        self.loss_range = (float(loss_range[0]), float(loss_range[1]))
        self.level = float(level)
        self.intervals = intervals or {n: [math.nan, math.nan] for n in NAMES}
        self.smooth, self.skip = int(smooth), float(skip)
        self.inputs = inputs or {}
        self.diagnostics = diagnostics or {}
        self.created = created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.tool_version = tool_version or step1.tool_version
        self.conventions = conventions or step1.conventions

    form = FORM

    @property
    def params(self) -> dict:
        return dict(zip(NAMES, map(float, self.theta), strict=True))

    @property
    def expression(self) -> str:
        return (f"acc = a / (1 + exp(-k ({self.via} - L0))) + b;  {self.via} = "
                f"{self.step1.form} law: {self.step1.expression}")

    @property
    def band_method(self) -> str:
        return "step-1 band x step-2 bootstrap + residual + extrapolation (monte carlo)"

    def accuracy(self, loss):
        """Step 2 alone: the accuracy the sigmoid gives a task loss."""
        return sigmoid(loss, *self.theta)

    def predict_loss(self, level: float | None = None, **inputs) -> Prediction:
        """Step 1 alone: the task loss at ``inputs`` (step 1's keywords)."""
        return self.step1.predict(level=level or self.level, **inputs)

    def predict(self, query: Query | None = None, /, *, level: float | None = None,
                draws: int = N_DRAWS, seed: int = 0, **fields) -> Prediction:
        """Accuracy and its band at ``query`` (step 1's query, ladder.fit.prediction.Query, or its
        fields; step 1's options, e.g. ``extrapolation``, pass through)."""
        level = self.level if level is None else float(level)
        if not 0 < level < 1:
            raise ValueError(f"level: must be in (0, 1), got {level!r}")
        options = {k: fields.pop(k) for k in ("extra_log_sigma", "extrapolation") if k in fields}
        p1 = self.step1.predict(Query.of(query, **fields), level=self.level, **options)
        L = np.atleast_1d(np.asarray(p1.loss, dtype=float))
        lo1 = np.atleast_1d(np.asarray(p1.lo, dtype=float))
        hi1 = np.atleast_1d(np.asarray(p1.hi, dtype=float))
        center = np.clip(self.accuracy(L), 0.0, 1.0)
        lo = np.full_like(center, np.nan)
        hi = np.full_like(center, np.nan)
        if len(self.boot_theta) and np.all(np.isfinite(lo1)) and np.all(np.isfinite(hi1)):
            rng = np.random.default_rng(seed)
            zq = float(ndtri((1 + self.level) / 2))
            for i in range(len(L)):
                z = rng.standard_normal(draws)
                s = np.where(z < 0, np.log(L[i] / lo1[i]), np.log(hi1[i] / L[i])) / zq
                lo[i], hi[i] = self._band(L[i] * np.exp(z * s), level, rng)
        else:
            warnings.warn("task law: no bootstrap draws of step 2, or step 1 has no band: the "
                          "band cannot be computed and is reported as NaN", stacklevel=2)
        shape = np.shape(p1.loss)
        return Prediction(loss=center.reshape(shape), lo=lo.reshape(shape),
                          hi=hi.reshape(shape), level=level)

    def accuracy_band(self, loss, level: float | None = None, *, draws: int = N_DRAWS,
                      seed: int = 0) -> Prediction:
        """Step 2 alone: the accuracy at a known task loss, its band from step 2's bootstrap,
        residual and extrapolation terms (what a measured loss says of accuracy)."""
        level = self.level if level is None else float(level)
        L = np.atleast_1d(np.asarray(loss, dtype=float))
        rng = np.random.default_rng(seed)
        band = np.array([self._band(np.full(draws, x), level, rng) for x in L]) \
            if len(self.boot_theta) else np.full((len(L), 2), np.nan)
        shape = np.shape(loss)
        return Prediction(loss=np.clip(self.accuracy(L), 0, 1).reshape(shape),
                          lo=band[:, 0].reshape(shape), hi=band[:, 1].reshape(shape),
                          level=level)

    def _band(self, losses: np.ndarray, level: float, rng) -> tuple[float, float]:
        """Quantiles at ``level`` of step 2's accuracy over draws of the task loss: each
        through one bootstrap sigmoid, plus a resampled residual, plus the extrapolation
        error below the fitted losses (see the module's docstring)."""
        n = len(losses)
        th = self.boot_theta[np.arange(n) % len(self.boot_theta)]
        acc = sigmoid(losses, th[:, 0], th[:, 1], th[:, 2], th[:, 3])
        acc = acc + rng.choice(self.resid, size=n)
        dist = np.maximum(0.0, self.loss_range[0] - losses)
        acc = acc + rng.standard_normal(n) * self.ext.get("rate", 0.0) * dist
        lo, hi = np.clip(np.quantile(acc, ((1 - level) / 2, (1 + level) / 2)), 0.0, 1.0)
        return float(lo), float(hi)

    # -- artifacts ----------------------------------------------------------------------
    def _uncertainty_own(self) -> dict:
        return {"method": self.band_method + " (ladder.fit.task)",
                "bootstrap_theta": self.boot_theta.tolist(),
                "residuals": self.resid.tolist(),
                "extrapolation_rate": self.ext.get("rate", 0.0)}

    def _json_own(self) -> dict:
        return {"task": {"schema": TASK_SCHEMA, "via": self.via,
                         "step1": self.step1.to_json(), "loss_range": list(self.loss_range),
                         "smooth": self.smooth, "skip": self.skip, "anchor": list(ANCHOR),
                         "draws": N_DRAWS}}

    def to_json(self) -> dict:
        return to_jsonable(lawjson.to_json(self))

    @classmethod
    def from_json(cls, obj: dict, *, path=None) -> TaskLaw:
        where = str(path) if path else "<law>"

        def bad(field_, msg):
            return InputError(msg, path=where, field=field_)
        obj = lawjson.upgrade(obj, path=path)
        lawjson.check_envelope(obj, path=path, forms=(FORM,))
        task = obj.get("task")
        if not isinstance(task, dict):
            raise bad("task", "missing or not an object")
        if task.get("schema") != TASK_SCHEMA:
            raise bad("task.schema", f"expected {TASK_SCHEMA!r}, got {task.get('schema')!r}")
        via = task.get("via")
        if not isinstance(via, str) or not via:
            raise bad("task.via", "missing or not a string")
        if not isinstance(task.get("step1"), dict) or task["step1"].get("form") == FORM:
            raise bad("task.step1", "missing, or not a law of the task loss")
        step1 = LawResult.from_json(task["step1"], path=f"{where}: task.step1")
        params = obj.get("params")
        if not isinstance(params, dict):
            raise bad("params", "missing or not an object")
        theta = []
        for n in NAMES:
            v = params.get(n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(f"params.{n}", "missing or not a finite number")
            theta.append(float(v))
        theta = np.asarray(theta)
        if np.any(theta < LOWER) or np.any(theta > UPPER):
            raise bad("params", "outside the sigmoid's bounds (a in [-1, 0], L0 >= 0, "
                                "k in [0, 1000], b in [0, 1])")
        unc = obj.get("uncertainty") or {}
        try:
            boot = np.asarray(unc.get("bootstrap_theta") or [], dtype=float).reshape(
                -1, len(NAMES))
            resid = np.asarray(unc.get("residuals") or [0.0], dtype=float).ravel()
            rate = float(unc.get("extrapolation_rate", 0.0))
            lr = [float(x) for x in task.get("loss_range")]
            level = float(unc.get("level", 0.9))
        except (TypeError, ValueError):
            raise bad("uncertainty", "bootstrap_theta, residuals, extrapolation_rate, "
                                     "level and task.loss_range must be numbers") from None
        if not (np.all(np.isfinite(boot)) and np.all(np.isfinite(resid)) and len(resid)
                and math.isfinite(rate) and rate >= 0 and len(lr) == 2 and 0 < level < 1):
            raise bad("uncertainty", "non-finite or out-of-range numbers")
        diag = obj.get("diagnostics") or {}
        ext = dict(diag.get("step2_extrapolation") or {})
        ext["rate"] = rate
        return cls(via=via, metric=obj.get("metric"), step1=step1, theta=theta,
                   boot_theta=boot, resid=resid, ext=ext, loss_range=lr, level=level,
                   intervals=unc.get("intervals"), smooth=int(task.get("smooth", SMOOTH)),
                   skip=float(task.get("skip", SKIP)), inputs=obj.get("inputs") or {},
                   diagnostics=diag, created=obj.get("created"),
                   tool_version=obj.get("tool_version"), conventions=obj.get("conventions"))

    def _report_lines(self) -> list[str]:
        d = self.diagnostics
        ext = self.ext
        lines = [f"step 2: sigmoid of {self.via} on {self.inputs.get('n_points')} smoothed evals "
                 f"(moving average {self.smooth}, first {self.skip:.0%} of each run skipped) "
                 f"+ the point (L=0, acc=1); RMS residual "
                 f"{d.get('step2_rms_residual', math.nan):.4g}"]
        lines += parameter_lines(self, {}, {}, "")
        lines.append(f"step 2 rollout over sizes: extrapolation rate {ext.get('rate', 0):.4g} "
                     f"accuracy per unit of loss below the fitted range "
                     f"[{self.loss_range[0]:.4g}, {self.loss_range[1]:.4g}]")
        lines.append(f"band: {self.band_method}")
        lines.append(f"step 1 ({self.via}):")
        lines += ["  " + s for s in self.step1.report().splitlines()]
        return lines
