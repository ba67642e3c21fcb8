"""Fitting a law to a points table: ``fit_law(df, form=...) -> FitResult``.

Objective: Huber (delta 1e-3) of log residuals, *summed* over points (Hoffmann et al. 2022, App.
D.2, averaged it; Besiroglu et al. 2024 show the average stops L-BFGS early and gives wrong
parameters). Multi-start from the form's grid (for ``chinchilla`` the paper's 4,500 starts), every
start run to convergence by the batched L-BFGS of ``fit.solver``, the best polished with scipy's
L-BFGS-B at tight tolerances.

Uncertainty (both kept in law.json, so bands can be recomputed):
- a run-level Bayesian bootstrap (Dirichlet weights on *runs*: points of one run are correlated),
  each replicate refitted from the point estimate and the other distinct local optima;
- a lack-of-fit Student-t interval: residual scale sigma from the fit, t quantile with the
  residual degrees of freedom, and the delta-method covariance sigma^2 (J'J)^-1 (plus a prior's
  precision, ``--prior``) for the parameter part. For runs with several points the dof are the
  effective number of independent residuals (lag-1 autocorrelation along each run) less the free
  parameters, never below runs minus across-run parameters.
A prediction band at a point: in log space, the parameter part is the bootstrap quantile
deviation where the bootstrap has usable replicates, else t x the delta-method standard error;
the run-to-run noise part is t x sigma; an extra log-sigma (eval noise, added by a forecaster)
is added in quadrature. A band that cannot be computed (no residual degrees of freedom, no
usable replicates) is NaN with a warning. ``objective="ols"`` (the real ladder's fit) has its
own band: statsmodels' OLS prediction interval of log(L - E).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import time
import warnings
import numpy as np
import pandas as pd
from scipy.special import ndtri, stdtrit  # quantiles; scipy.stats takes 0.6 s to import

from fit.forms import FORMS, Form, Model, Spec, get_form
from fit.prediction import Prediction
from fit.solver import STATUS, lbfgs
from ladder.io import InputError, as_float, sha256_of

SCHEMA = "law/1"
HUBER_DELTA = 1e-3
OBJECTIVES = ("huber", "ols")
CURVE_FORMS = ("mpl", "momentum")  # fit.curves (schedule-aware curve laws)


# ----------------------------------------------------------------------------- results


class FitResult:
    """A fitted law: parameters, intervals, diagnostics, ``predict()``, ``report()``, JSON.

    For ``by=`` fits (one law per value of a column, e.g. the real ladder's per-fraction fits)
    ``groups`` holds the per-value results and ``predict(fraction=...)`` uses the matching one,
    interpolating log loss linearly between neighbouring values.
    """

    def __init__(self, *, spec: Spec, metric: str, u: np.ndarray, level: float,
                 params_column: str = "params", boot_u: np.ndarray | None = None,
                 cov: np.ndarray | None = None, sigma: float | None = None,
                 dof: float | None = None, intervals: dict | None = None,
                 diagnostics: dict | None = None, inputs: dict | None = None,
                 conventions: dict | None = None, created: str | None = None,
                 tool_version: str | None = None, by: str | None = None,
                 groups: list | None = None, objective: str = "huber",
                 prior: dict | None = None, abs_resid: np.ndarray | None = None):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective: one of {OBJECTIVES}, got {objective!r}")
        self.objective = objective
        self.prior = dict(prior or {})  # name -> (mean, sd), natural units
        self.spec = spec
        self.metric = metric
        self.u = np.asarray(u, dtype=float)
        self.level = float(level)
        self.params_column = params_column
        self.boot_u = None if boot_u is None else np.asarray(boot_u, dtype=float)
        self.cov = None if cov is None else np.asarray(cov, dtype=float)
        self.sigma = sigma
        self.dof = dof
        # sorted |log residuals| of the fitted points: the noise part of the band is their
        # quantile (noise_half_width); None (a law.json from before) -> t(dof) x sigma
        self.abs_resid = None if abs_resid is None else np.sort(np.abs(np.asarray(
            abs_resid, dtype=float)))
        self.intervals = intervals or {}
        self.diagnostics = diagnostics or {}
        self.inputs = inputs or {}
        self.conventions = conventions or _conventions()
        self.created = created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.tool_version = tool_version or _version()
        self.by = by
        self.groups = groups or []  # list of (value, FitResult)

    # --- named views ---------------------------------------------------------------------------
    @property
    def form(self) -> str:
        return self.spec.form.name

    @property
    def expression(self) -> str:
        return self.spec.form.expression

    @property
    def params(self) -> dict:
        return {p.name: float(p.to_display(self.u[i])) for i, p in enumerate(self.spec.form.params)}

    # --- prediction ----------------------------------------------------------------------------
    def predict(self, params=None, active_params=None, tokens=None, compute=None, fraction=None,
                level: float = 0.9, extra_log_sigma=0.0, extrapolation: bool = True
                ) -> Prediction:
        """Loss and its band at ``level`` (numpy arrays, inputs broadcast). ``compute`` and
        ``tokens`` are so far at the point (points-table convention); ``fraction`` is the
        progress through the planned run (trajectory and per-fraction laws; default 1).
        ``extra_log_sigma``: a further log sd (eval noise) added in quadrature; the band also
        holds the law's extrapolation error outside its runs' scale range
        (:meth:`extrapolation_log_sd`) unless ``extrapolation=False``."""
        level = float(level)
        if not 0 < level < 1:
            raise ValueError(f"level: must be in (0, 1), got {level!r}")
        if extrapolation:
            x = self.extrapolation_log_sd(params=params, tokens=tokens, compute=compute,
                                          fraction=fraction)
            extra_log_sigma = np.sqrt(np.square(np.asarray(extra_log_sigma, float)) + x ** 2)
        if self.groups:
            return self._predict_groups(params, active_params, tokens, compute, fraction, level,
                                        extra_log_sigma)
        cols = self._columns(params, active_params, tokens, compute, fraction)
        shape = np.broadcast(*cols.values()).shape
        flat = {k: np.broadcast_to(v, shape).ravel() for k, v in cols.items()}
        fr = self.diagnostics.get("fraction_range")
        below = None
        if "fraction" in cols and fr and as_float(fr[0]) is not None:
            # below the smallest fitted fraction nothing was measured: the early-transient
            # factor is held at its value there (1/g would otherwise explode), and a warning
            # says that these points are extrapolated
            flat["fraction_floor"] = float(as_float(fr[0]))
            below = flat["fraction"] < flat["fraction_floor"] - 1e-9
        if below is not None and below.any():
            warnings.warn(f"{self.form} law: fractions below {flat['fraction_floor']:g}, the "
                          "smallest fitted, are extrapolated", stacklevel=2)
        model = Model(self.spec.form, self.spec.form.features(flat))
        center = model.log_predict(self.u[None])[0]
        lo, hi = self._band(model, center, level, np.broadcast_to(extra_log_sigma, shape).ravel())
        return Prediction(loss=np.exp(center).reshape(shape), lo=lo.reshape(shape),
                          hi=hi.reshape(shape), level=level)

    def extrapolation_log_sd(self, params=None, tokens=None, compute=None, fraction=None
                             ) -> np.ndarray:
        """The law's own extrapolation error (a log sd) at each point: the RMS over its rollout
        backtest folds (refit below a scale level, forecast that level's finals) of log error
        per decade extrapolated, times the point's decades outside the scale range of the runs
        it was fitted on, above the largest or below the smallest (a run's scale: planned
        compute, else params x tokens, else params: ``diagnostics.backtest.scale``; a point's
        is its value at fraction 1). 0 inside the range, without a backtest, or without the
        input the scale needs. Below the range the rate measured upward is assumed: a ladder
        rung held out at the bottom is 0.85 decades below the rest on Gadre et al.'s ladder and
        its law misses it by 5-24% (docs/LOG.md, 2026-12-01)."""
        rate, kind, lo, hi = extrapolation_rate(self.diagnostics.get("backtest"))
        given = [np.asarray(x, float) for x in (params, tokens, compute, fraction)
                 if x is not None]
        shape = np.broadcast(*given).shape if given else ()
        fr = np.asarray(1.0 if fraction is None else fraction, float)
        scale = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if kind == "compute" and compute is not None:
                scale = np.asarray(compute, float) / fr
            elif kind == "params_x_tokens" and params is not None and tokens is not None:
                scale = np.asarray(params, float) * np.asarray(tokens, float) / fr
            elif kind == "params" and params is not None:
                scale = np.asarray(params, float)
        if rate is None or scale is None:
            return np.zeros(shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            ls = np.log10(np.broadcast_to(scale, shape))
        d = np.maximum(ls - hi, 0.0) + (np.maximum(lo - ls, 0.0) if lo is not None else 0.0)
        return rate * np.where(np.isfinite(d), d, 0.0)

    def _columns(self, params, active_params, tokens, compute, fraction) -> dict:
        given = {"params": params, "active_params": active_params, "tokens": tokens,
                 "compute": compute, "fraction": fraction}
        form = self.spec.form
        if form.name == "trajectory" and fraction is None:
            given["fraction"] = 1.0
        cols = {}
        for need in form.needs:
            key = self.params_column if need == "N" else need
            v = given.get(key)
            if v is None:
                raise InputError(f"the {form.name} law needs --{key.replace('_', '-')}",
                                 field=key)
            v = np.asarray(v, dtype=float)
            if not np.all(np.isfinite(v) & (v > 0)):
                raise InputError("must be finite and positive", field=key)
            if need == "fraction" and np.any(v > 1):
                raise InputError("must be in (0, 1]", field="fraction")
            cols[need] = v
        return cols

    def _band(self, model, center, level, extra):
        """lo, hi (loss units) around ``center`` (log loss) at ``level``."""
        if self.objective == "ols":
            return self._band_ols(model, center, level, extra)
        q = 0.5 + level / 2
        dof = self.dof
        tq = float(stdtrit(dof, q)) if dof and dof > 0 else None
        z = float(ndtri(q))
        reasons = []
        # parameter part
        up = np.zeros_like(center)
        down = np.zeros_like(center)
        have_param = False
        if self.boot_u is not None and len(self.boot_u) >= 20:
            draws = model.log_predict(self.boot_u)           # (R, m)
            dev = draws - center[None]
            up = np.maximum(up, np.quantile(dev, q, axis=0))
            down = np.maximum(down, -np.quantile(dev, 1 - q, axis=0))
            have_param = True
        # the delta method only where the bootstrap is not there: t(dof) x se on top of a
        # bootstrap that already measured the parameters' spread doubles it, and with the
        # 1-2 residual dof of a 4-5 rung ladder t is 3-6 (Gadre's 5-run fit: +-25% at 6.9B)
        if self.cov is not None and tq is not None and not have_param:
            _u0, M = self.spec.mapping()
            J = _jacobian_rows(model, self.u) @ M             # (m, F)
            se = np.sqrt(np.maximum(np.einsum("mf,fg,mg->m", J, self.cov, J), 0.0))
            up = np.maximum(up, tq * se)
            down = np.maximum(down, tq * se)
            have_param = True
        if not have_param:
            reasons.append("no parameter uncertainty (no bootstrap replicates and no "
                           "covariance)")
        half_noise = self.noise_half_width(level)
        if half_noise is None:
            reasons.append("no residual degrees of freedom to estimate run-to-run noise "
                           f"(dof={dof})")
            noise = np.full_like(center, np.nan)
        else:
            noise = np.full_like(center, half_noise)
        extra = z * np.asarray(extra, dtype=float)
        if reasons:
            warnings.warn(f"{self.form} law: prediction band unavailable: "
                          + "; ".join(reasons), stacklevel=3)
            nan = np.full_like(center, np.nan)
            return nan, nan
        hi = center + np.sqrt(up ** 2 + noise ** 2 + extra ** 2)
        lo = center - np.sqrt(down ** 2 + noise ** 2 + extra ** 2)
        return np.exp(lo), np.exp(hi)

    def noise_method(self, level: float = 0.9) -> str:
        """Which estimate the band's noise part uses at ``level`` (see noise_half_width)."""
        if self.objective == "ols":
            return "ols"
        return "residual quantile" if self._noise_rank_level(level) is not None else \
            "student-t x sigma"

    def _noise_rank_level(self, level):
        a, dof = self.abs_resid, self.dof
        if a is None or not a.size or not dof or dof <= 0:
            return None
        m = dof + self.spec.n_free                 # effective number of observations
        qq = level * (m + 1) / m                   # split-conformal rank ceil((m+1) level)/m
        return qq if qq <= 1 else None

    def noise_half_width(self, level: float) -> float | None:
        """Half-width (log loss) of the band's run-to-run noise part at ``level``.

        The ``level`` quantile of the fitted points' |log residuals|, at the split-conformal
        rank (level x (m + 1) / m of m effective observations, m = dof + free parameters) and
        scaled by sqrt(m / dof) for the parameters the fit spent on them. Distribution-free:
        the summed-Huber fit is robust because ladder residuals are not Gaussian (Gadre et
        al.'s M=5 runs miss the law by 4-15% where the rest sit within 1-2%), and t(dof) x
        their RMS let those few points set a +-6% band for every target (leave-one-rung-out
        coverage 97% on RedPajama, bands 3-12x the typical held-out error). Too few
        observations for the rank (m < level / (1 - level), 9 at 90%, 99 at 99%): the
        Student-t interval t(dof) x sigma, the parametric answer where the empirical one
        does not exist."""
        qq = self._noise_rank_level(level)
        if qq is not None:
            m = self.dof + self.spec.n_free
            return float(np.quantile(self.abs_resid, qq)) * math.sqrt(m / self.dof)
        if self.sigma is None or not self.dof or self.dof <= 0:
            return None
        return float(stdtrit(self.dof, 0.5 + level / 2)) * self.sigma

    def _band_ols(self, model, center, level, extra):
        """The OLS prediction interval of log(L - E) (statsmodels' ``obs_ci``: Student-t with
        the residual dof, mean-prediction variance x' V x plus the residual variance), mapped
        to loss; an extra log-sigma (eval noise) is added in quadrature in log-loss space."""
        q = 0.5 + level / 2
        if not (self.dof and self.dof > 0 and self.cov is not None and self.sigma is not None):
            warnings.warn(f"{self.form} law (ols): prediction band unavailable: no residual "
                          f"degrees of freedom (dof={self.dof})", stacklevel=3)
            nan = np.full_like(center, np.nan)
            return nan, nan
        E = float(self.params["E"])
        x = np.stack([np.ones_like(center), -model.feats["logC"]], axis=1)   # d r / d (logA, alpha)
        r = np.log(np.exp(center) - E)
        se = np.sqrt(np.einsum("mf,fg,mg->m", x, self.cov, x) + self.sigma ** 2)
        half = float(stdtrit(self.dof, q)) * se
        lo_l, hi_l = np.log(E + np.exp(r - half)), np.log(E + np.exp(r + half))
        ex = float(ndtri(q)) * np.asarray(extra, dtype=float)
        lo = center - np.sqrt((center - lo_l) ** 2 + ex ** 2)
        hi = center + np.sqrt((hi_l - center) ** 2 + ex ** 2)
        return np.exp(lo), np.exp(hi)

    def _predict_groups(self, params, active_params, tokens, compute, fraction, level, extra):
        values = np.array([v for v, _ in self.groups])
        g = np.asarray(1.0 if fraction is None else fraction, dtype=float)
        shape = np.broadcast(*[np.asarray(x) for x in (params, active_params, tokens, compute,
                                                        g, extra) if x is not None]).shape
        gb = np.broadcast_to(g, shape).ravel()
        tol = 1e-6 + 0.5e-3  # group values are fractions rounded to 1e-3
        if np.any(gb < values.min() - tol) or np.any(gb > values.max() + tol):
            raise InputError(f"outside the fitted range {values.min():g}..{values.max():g} of "
                             f"the per-{self.by} laws", field=self.by)
        out = np.full((3, gb.size), np.nan)
        def b(x):
            return None if x is None else np.broadcast_to(np.asarray(x, float), shape).ravel()
        kw = {"params": b(params), "active_params": b(active_params), "tokens": b(tokens),
              "compute": b(compute), "level": level, "extra_log_sigma": b(extra),
              "extrapolation": False}  # the whole law's term is already in ``extra``
        preds = [r.predict(**kw) for _, r in self.groups]
        logs = np.log(np.array([[p.loss, p.lo, p.hi] for p in preds]))  # (G, 3, m)
        for j in range(gb.size):
            gj = min(max(gb[j], values.min()), values.max())
            i = int(np.searchsorted(values, gj))
            if i < len(values) and abs(values[i] - gj) <= tol or i == 0:
                out[:, j] = logs[min(i, len(values) - 1), :, j]
            elif abs(values[i - 1] - gj) <= tol or i == len(values):
                out[:, j] = logs[i - 1, :, j]
            else:
                w = (gj - values[i - 1]) / (values[i] - values[i - 1])
                out[:, j] = (1 - w) * logs[i - 1, :, j] + w * logs[i, :, j]
        loss, lo, hi = (np.exp(out[k]).reshape(shape) for k in range(3))
        return Prediction(loss=loss, lo=lo, hi=hi, level=level)

    # --- text ----------------------------------------------------------------------------------
    def report(self) -> str:
        from fit.report import report
        return report(self)

    # --- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        from fit.lawjson import to_json
        return to_json(self)

    @classmethod
    def from_json(cls, obj: dict, *, path=None) -> FitResult:
        from fit.lawjson import from_json
        return from_json(obj, path=path)


# ----------------------------------------------------------------------------- fitting


def fit_law(df, form: str = "auto", fix: dict | None = None, tie: dict | None = None,
            by: str | None = None, bootstrap: int = 200, level: float = 0.9, seed: int = 0,
            params_column: str = "params", metric: str | None = None,
            delta: float = HUBER_DELTA, backtest: bool = True, objective: str = "huber",
            prior: dict | None = None, asymptote_rule: bool = True) -> FitResult:
    """Fit ``form`` to the points table ``df`` (from :func:`fit.load_points`).

    ``objective``: "huber" (summed Huber of log residuals, the default) or "ols" (least squares
    of log(L - E) on log C, E fixed: the real ladder's own fit). ``prior``: {name: (mean, sd)}
    in natural units, a Gaussian penalty on those parameters (see :class:`_Problem`).
    ``asymptote_rule``: on a short ladder that leaves E unidentified, choose among free, prior
    and fixed-E variants by rollout backtest (``fit.select.asymptote_rule``)."""
    from fit.points import COLUMNS, load_points
    if not isinstance(df, pd.DataFrame) or not set(COLUMNS) <= set(df.columns):
        df = load_points(df, metric)  # files, or a bare DataFrame: normalise and clean it
    metric = metric or df.attrs.get("metric") or "loss"
    if not 0 < level < 1:
        raise InputError(f"must be in (0, 1), got {level!r}", field="level")
    if bootstrap < 0:
        raise InputError(f"must be >= 0, got {bootstrap!r}", field="bootstrap")
    if params_column not in ("params", "active_params"):
        raise InputError("must be 'params' or 'active_params'", field="params_column")
    fix, tie = dict(fix or {}), dict(tie or {})
    prior = _check_prior(prior, fix)
    if objective not in OBJECTIVES:
        raise InputError(f"one of {', '.join(OBJECTIVES)}, got {objective!r}", field="objective")
    if objective == "ols" and (form != "compute" or set(fix) != {"E"} or tie or prior):
        raise InputError("ols is least squares of log(L - E) on log C: it needs --form compute "
                         "with E fixed (--fix E=VALUE) and no --tie or --prior",
                         field="objective")
    if form in CURVE_FORMS:  # schedule-aware curve laws live in fit.curves
        if tie or by or prior or objective != "huber":
            raise InputError(f"the {form} form takes no --tie, --by, --prior or --objective",
                             field="form")
        from fit.curves import fit_curve_law
        return fit_curve_law(df, form=form, bootstrap=bootstrap, level=level, seed=seed,
                             metric=metric, fix=fix or None)
    opts = {"bootstrap": bootstrap, "level": level, "seed": seed, "params_column": params_column,
                "metric": metric, "delta": delta, "backtest": backtest, "objective": objective,
                "prior": prior}
    if by is not None:
        return _fit_by(df, form, fix, tie, by, opts)
    if form == "auto":
        from fit.select import fit_auto
        res = fit_auto(df, fix, tie, opts)
    else:
        res = fit_one(df, _spec(form, fix, tie), **opts)
    if asymptote_rule and objective == "huber" and backtest and isinstance(res, FitResult):
        from fit.select import asymptote_rule as rule
        res = rule(df, res, opts, fix, tie, prior)
    return res


def extrapolation_rate(bt) -> tuple:
    """(RMS log error per decade, scale kind, log10 of the smallest and the largest run's
    scale) from a backtest's record (``diagnostics.backtest``); rate None without a fold that
    extrapolated. The smallest is None in law.json files written before it was recorded (their
    band then widens only above the largest run, as the forecast did)."""
    bt = bt if isinstance(bt, dict) else {}
    per_decade = []
    for fold in bt.get("folds") or []:
        d = fold.get("decades") if isinstance(fold, dict) else None
        if not (isinstance(d, (int, float)) and d > 0):
            continue
        per_decade += [math.log1p(float(e)) / d for e in fold.get("final_rel_err") or []
                       if isinstance(e, (int, float)) and math.isfinite(e) and e > -1]
    top, bottom, kind = bt.get("scale_log10_max"), bt.get("scale_log10_min"), bt.get("scale")
    if not per_decade or not isinstance(top, (int, float)) or kind not in (
            "compute", "params_x_tokens", "params"):
        return None, kind, None, None
    bottom = float(bottom) if isinstance(bottom, (int, float)) else None
    return float(np.sqrt(np.mean(np.square(per_decade)))), kind, bottom, float(top)


def _check_prior(prior, fix) -> dict:
    out = {}
    for k, v in (prior or {}).items():
        try:
            mean, sd = (float(x) for x in v)
        except (TypeError, ValueError):
            raise InputError(f"{k}: expected (mean, sd), got {v!r}", field="prior") from None
        if not (math.isfinite(mean) and math.isfinite(sd) and sd > 0):
            raise InputError(f"{k}: needs a finite mean and sd > 0, got {v!r}", field="prior")
        if k in fix:
            raise InputError(f"{k}: both fixed and given a prior", field="prior")
        out[k] = (mean, sd)
    return out


def _spec(form: str, fix: dict, tie: dict) -> Spec:
    if form in CURVE_FORMS:
        raise InputError(f"the {form} form is a schedule-aware curve law (fit.curves)",
                         field="form")
    if form not in FORMS:
        raise InputError(f"unknown form {form!r}; one of auto, {', '.join(FORMS)}", field="form")
    try:
        return Spec(get_form(form), fix=fix, tie=tie)
    except ValueError as e:
        raise InputError(str(e), field="fix" if fix else "tie") from None


def _fit_by(df, form, fix, tie, by, opts) -> FitResult:
    if by not in df.columns or df[by].isna().all():
        raise InputError(f"no column '{by}' to group by", field="by")
    if form == "auto":
        raise InputError("--by needs an explicit --form", field="by")
    spec = _spec(form, fix, tie)
    key = df[by].round(3) if by == "fraction" else df[by]
    groups = []
    for i, (value, sub) in enumerate(sorted(df.groupby(key), key=lambda kv: kv[0])):
        o = dict(opts, seed=opts["seed"] + i)
        r = fit_one(sub.copy(), spec, final_only=False, **o)
        groups.append((float(value), r))
    if not groups:
        raise InputError("no points", field="by")
    last = groups[-1][1]
    diag = {"by": by, "n_groups": len(groups), "dropped_rows": list(df.attrs.get("dropped", [])),
            "groups": [{by: v, "params": r.params, "objective": r.diagnostics.get("objective"),
                        "converged": r.diagnostics.get("converged")} for v, r in groups]}
    if opts["backtest"]:
        from fit.backtest import backtest, trajectory_vs_per_fraction
        diag["backtest"] = backtest(df, spec, dict(opts, bootstrap=0, backtest=False), by=by)
        if by == "fraction" and spec.form.name == "compute" and set(spec.fix) == {"E"}:
            try:
                diag["trajectory_vs_per_fraction"] = trajectory_vs_per_fraction(
                    df, opts, per_fraction_bt=diag["backtest"], E=float(spec.fix["E"]))
            except InputError as e:
                diag["trajectory_vs_per_fraction"] = {"error": str(e)}
    return FitResult(spec=spec, metric=opts["metric"], u=last.u, level=opts["level"],
                     params_column=opts["params_column"], boot_u=last.boot_u, cov=last.cov,
                     sigma=last.sigma, dof=last.dof, intervals=last.intervals,
                     diagnostics=diag, inputs=_inputs(df), by=by, groups=groups,
                     objective=last.objective, prior=last.prior, abs_resid=last.abs_resid)


def fit_one(df: pd.DataFrame, spec: Spec, *, bootstrap=200, level=0.9, seed=0,
            params_column="params", metric="loss", delta=HUBER_DELTA, backtest=True,
            final_only: bool | None = None, starts: np.ndarray | None = None,
            objective: str = "huber", prior: dict | None = None) -> FitResult:
    """One form on one table: multi-start fit, bootstrap, diagnostics, backtests."""
    form = spec.form
    if objective == "ols":
        return _fit_ols(df, spec, level=level, metric=metric, params_column=params_column,
                        final_only=final_only, backtest=backtest, seed=seed)
    prior = dict(prior or {})
    for k in prior:
        if k not in form.names:
            raise InputError(f"{k}: not a parameter of the {form.name} form (parameters: "
                             f"{', '.join(form.names)})", field="prior")
        if k in spec.fix:
            raise InputError(f"{k}: both fixed and given a prior", field="prior")
    data, note = select_points(df, form, final_only)
    cols = _required(data, form, params_column)
    n, runs = len(data), data["run"].astype(str).to_numpy()
    uniq_runs = np.unique(runs)
    if n < spec.n_free or len(uniq_runs) < spec.n_across:
        raise InputError(
            f"{n} points from {len(uniq_runs)} runs cannot determine the {spec.n_free} free "
            f"parameters of the {form.name} form ({', '.join(spec.free)}); add runs or fix "
            "parameters (--fix NAME=VALUE, --tie A=B)", field="form")
    model = Model(form, form.features(cols))
    logy = np.log(data["loss"].to_numpy(dtype=float))
    prob = _Problem(model, logy, spec, delta)
    if starts is not None:
        grid = np.atleast_2d(starts)
    else:
        grid = spec.grid()
        if form.centered_grid:  # grid values are in the centred coordinates
            grid = grid @ prob.P.T
    res = prob.solve(grid, ftol=STAGE1_FTOL, patience=STAGE1_PATIENCE,
                     max_iter=STAGE1_MAX_ITER)
    prior_weight = None
    if prior:
        # the penalty is a Gaussian prior on the scale of the data term: summed Huber ~
        # sum r^2 / 2 = sigma^2 x (negative log-likelihood), so the prior's negative
        # log-likelihood is multiplied by sigma^2, estimated from the unpenalised fit's
        # residuals (sum r^2 / (n - free)); with no residual dof the Huber delta (the scale at
        # which the objective stops being quadratic) stands in for sigma
        i0 = int(np.nanargmin(np.where(np.isfinite(res.f), res.f, np.inf)))
        r0 = logy - model.log_predict(spec.to_u(res.x[i0])[None])[0]
        s2 = float((r0 ** 2).sum() / (n - spec.n_free)) if n > spec.n_free else 0.0
        prior_weight = max(s2, delta ** 2)
        prob = _Problem(model, logy, spec, delta, prior=prior, prior_weight=prior_weight)
        res = prob.solve(np.vstack([grid, prob.prior_start(res.x[i0])]), ftol=STAGE1_FTOL,
                         patience=STAGE1_PATIENCE, max_iter=STAGE1_MAX_ITER)
        grid = np.vstack([grid, grid[:1]])  # same length as res (best_start lookup below)
    order = np.argsort(np.where(np.isfinite(res.f), res.f, np.inf))
    near = order[:400][res.f[order[:400]] <= res.f[order[0]] * (1 + POLISH_WITHIN)]
    cands = _distinct(res.x[near], res.f[near], res.x[order[0]], k=POLISH_TOP)
    phi, fbest, pol = prob.polish(cands)
    pol_best = int(np.argmin(np.where(np.isfinite(pol.f), pol.f, np.inf)))
    best = order[0]
    u = spec.to_u(phi)
    logfit = model.log_predict(u[None])[0]
    resid = logy - logfit
    # distinct local optima within 10% of the best (warm starts of the bootstrap replicates)
    near10 = order[:400][res.f[order[:400]] <= fbest * 1.1]
    optima = _distinct(res.x[near10], res.f[near10], phi)

    # lack-of-fit: residual scale and degrees of freedom
    multi = data.groupby("run").size().max() > 1
    # a prior is one pseudo-observation of its parameter: one residual degree of freedom more
    n_prior = len(prior)
    rho = None
    if multi:
        # sigma is the sd of point residuals; the dof of that estimate is the number of
        # independent residuals, n_eff = n (1 - rho) / (1 + rho) for residuals that are AR(1)
        # along each run with lag-1 autocorrelation rho (the usual effective sample size of a
        # correlated series), less the free parameters; never below the across-run count
        rho = _lag1_autocorrelation(data, resid)
        n_eff = n * (1 - rho) / (1 + rho)
        dof = max(n_eff + n_prior - spec.n_free, len(uniq_runs) + n_prior - spec.n_across)
    else:
        dof = n + n_prior - spec.n_free
    sigma = float(np.sqrt((resid ** 2).sum() / (n + n_prior - spec.n_free))) \
        if n + n_prior > spec.n_free else None
    dof = float(dof) if dof > 0 else None
    cov = None
    if sigma is not None and sigma > 0:
        J = _jacobian_rows(model, u) @ prob.M
        # Laplace approximation of the penalised fit: the prior's precision (in the solver's
        # u coordinates) adds to J'J / sigma^2, so the prior's spread enters the band.
        # pinv: a shape factor driven to 0 leaves a flat direction; its variance is then not
        # propagated (it does not move the prediction either)
        H = J.T @ J / sigma ** 2 + prob.prior_precision(u)
        cov = np.linalg.pinv(H, rcond=1e-12)
        if not np.all(np.isfinite(cov)):
            cov = None

    boot_u, boot_info = None, {"replicates": 0}
    if bootstrap > 0:
        boot_u, boot_info = _bootstrap(prob, runs, optima, bootstrap, seed)

    intervals = _intervals(spec, u, boot_u, cov, dof, level)
    identifiability = _identifiability(spec, u, intervals, level, data, prior,
                                       have_interval=cov is not None or boot_u is not None)
    disp = {p.name: float(p.to_display(u[i])) for i, p in enumerate(form.params)}
    at_bound = {k: v for k, v in ((p.name, _bound_flag(p, disp[p.name])) for p in form.params
                                  if p.name in spec.free) if v}
    diagnostics = {
        "objective": float(fbest),
        "huber_delta": delta,
        "converged": bool(res.status[best] == 0 and pol.status[pol_best] == 0),
        "polish_gain_rel": float((res.f[best] - fbest) / max(abs(fbest), 1e-300)),
        "starts": len(grid),
        "starts_status": {STATUS[i]: int((res.status == i).sum()) for i in range(len(STATUS))},
        "best_start": grid[best].tolist(),
        "iterations_max": int(res.iterations.max()),
        "distinct_optima": len(optima),
        "polished_candidates": len(cands),
        "at_bound": at_bound,
        "free": list(spec.free),
        "n_points": n, "n_runs": len(uniq_runs),
        "fraction_range": [float(data["fraction"].min()), float(data["fraction"].max())],
        "points_note": note,
        "rmse_log": float(np.sqrt(np.mean(resid ** 2))),
        "max_abs_rel_residual": float(np.max(np.abs(np.expm1(-resid)))),
        "dof": dof, "sigma_log": sigma, "residual_lag1_autocorrelation": rho,
        "bootstrap": boot_info,
        "prior": {k: {"mean": m, "sd": sd} for k, (m, sd) in prior.items()} or None,
        "prior_weight": prior_weight,
        "identifiability": identifiability,
        "dropped_rows": list(df.attrs.get("dropped", [])),
    }
    if form.name == "chinchilla":
        from fit.allocation import allocation_diagnostics
        diagnostics["allocation"] = allocation_diagnostics(disp, boot_u, spec, level)
    result = FitResult(spec=spec, metric=metric, u=u, level=level, params_column=params_column,
                       boot_u=boot_u, cov=cov, sigma=sigma, dof=dof, intervals=intervals,
                       diagnostics=diagnostics, inputs=_inputs(data), prior=prior,
                       abs_resid=np.abs(resid))
    if backtest:
        from fit.backtest import backtest as run_backtest
        diagnostics["backtest"] = run_backtest(
            df, spec, {"bootstrap": 0, "level": level, "seed": seed, "params_column": params_column,
                           "metric": metric, "delta": delta, "backtest": False, "prior": prior},
            final_only=final_only, starts=_backtest_starts(grid, res, order))
        if form.name == "trajectory":
            from fit.backtest import trajectory_vs_per_fraction
            diagnostics["trajectory_vs_per_fraction"] = trajectory_vs_per_fraction(
                df, {"level": level, "seed": seed, "params_column": params_column, "metric": metric,
                         "delta": delta}, traj_bt=diagnostics["backtest"],
                E=float(spec.fix.get("E", 1.5)))
    return result


def _fit_ols(df, spec, *, level, metric, params_column, final_only, backtest, seed):
    """The real ladder's fit: ordinary least squares of log(L - E) on log C with E fixed
    (statsmodels OLS), the Student-t lack-of-fit interval with n - 2 residual dof its team asked
    for. Parameters: log A = intercept, alpha = -slope."""
    import statsmodels.api as sm  # only this path needs it (0.5 s to import)
    data, note = select_points(df, spec.form, final_only)
    cols = _required(data, spec.form, params_column)
    E = float(spec.fix["E"])
    L = data["loss"].to_numpy(dtype=float)
    if np.any(L <= E):
        raise InputError(f"ols needs every loss above the fixed E={E:g} (log(L - E)); "
                         f"{int((L <= E).sum())} are not", field="loss")
    n = len(data)
    if n < 2:
        raise InputError(f"{n} point cannot determine the 2 ols parameters (log A, alpha)",
                         field="form")
    logC = np.log(cols["compute"])
    y = np.log(L - E)
    X = np.column_stack([np.ones(n), logC])
    fit = sm.OLS(y, X).fit()
    b0, b1 = (float(v) for v in fit.params)
    D = np.diag([1.0, -1.0])                      # (log A, slope) -> (log A, alpha)
    dof = float(fit.df_resid) if fit.df_resid > 0 else None
    sigma = float(np.sqrt(fit.scale)) if dof else None
    cov = D @ np.asarray(fit.cov_params()) @ D if dof else None
    u = spec.to_u(np.array([b0, -b1]))
    intervals = {"E": [E, E]}
    if dof:
        ci = np.asarray(fit.conf_int(alpha=1 - level))
        intervals["A"] = [float(np.exp(ci[0, 0])), float(np.exp(ci[0, 1]))]
        intervals["alpha"] = [float(-ci[1, 1]), float(-ci[1, 0])]
    else:
        intervals["A"] = intervals["alpha"] = [math.nan, math.nan]
    resid = np.log(L) - Model(spec.form, spec.form.features(cols)).log_predict(u[None])[0]
    diagnostics = {
        "objective": float(fit.ssr), "objective_kind": "ols: sum of squared residuals of "
        "log(L - E) on log C (statsmodels OLS)", "converged": True, "free": list(spec.free),
        "at_bound": {}, "n_points": n, "n_runs": int(data["run"].nunique()),
        "fraction_range": [float(data["fraction"].min()), float(data["fraction"].max())],
        "points_note": note, "rmse_log": float(np.sqrt(np.mean(resid ** 2))),
        "max_abs_rel_residual": float(np.max(np.abs(np.expm1(-resid)))),
        "dof": dof, "sigma_log": sigma, "rsquared": float(fit.rsquared) if n > 2 else None,
        "bootstrap": {"replicates": 0, "note": "ols: Student-t interval only"},
        "dropped_rows": list(df.attrs.get("dropped", [])),
    }
    result = FitResult(spec=spec, metric=metric, u=u, level=level, params_column=params_column,
                       cov=cov, sigma=sigma, dof=dof, intervals=intervals,
                       diagnostics=diagnostics, inputs=_inputs(data), objective="ols")
    if backtest:
        from fit.backtest import backtest as run_backtest
        diagnostics["backtest"] = run_backtest(
            df, spec, {"bootstrap": 0, "level": level, "seed": seed, "params_column": params_column,
                       "metric": metric, "backtest": False, "objective": "ols"},
            final_only=final_only)
    return result


# Identifiability checks. An asymptote below half the smallest measured loss says most of the
# loss at the ladder's largest run is reducible: published LM ladders put E at 55-90% of the
# losses they fit (Hoffmann et al. 2022: E 1.69 against losses ~2-3; Besiroglu et al. 2024's
# refit 1.82; Marin's ladder fixes 1.5 against 2.4-3.0), so that is flagged as implausible, as
# is E at or above the smallest loss (impossible for a decreasing law). An interval that spans
# more than half of the range (0, min loss) means the ladder does not pin E down.
E_MIN_FRACTION_OF_LOSS = 0.5
E_INTERVAL_MAX_FRACTION = 0.5


def _identifiability(spec, u, intervals, level, data, prior, have_interval=True) -> dict:
    """Parameters the ladder does not pin down, with why: {"flags": {name: [reasons]},
    "unidentified": [names]}."""
    form = spec.form
    flags: dict[str, list[str]] = {}
    lmin = float(data["loss"].min())
    for i, p in enumerate(form.params):
        if p.name in spec.fix or p.name in spec.tie:
            continue
        why = []
        v = float(p.to_display(u[i]))
        lo, hi = intervals.get(p.name, [math.nan, math.nan])
        b = _bound_flag(p, v)
        if b:
            why.append(f"estimate {b}")
        if p.kind != "positive" and math.isfinite(lo) and math.isfinite(hi):
            blo, bhi = p.bounds
            if lo <= blo * 1.01 if blo > 0 else lo <= blo + 1e-6:
                why.append(f"its {level:.0%} interval reaches the lower bound {blo:g}")
            if hi >= bhi * 0.99:
                why.append(f"its {level:.0%} interval reaches the upper bound {bhi:g}")
        if p.name == "E":
            if v >= lmin:
                why.append(f"E = {v:.4g} is not below the smallest loss {lmin:.4g}")
            elif v < E_MIN_FRACTION_OF_LOSS * lmin:
                why.append(f"E = {v:.4g} is below {E_MIN_FRACTION_OF_LOSS:g} x the smallest loss "
                           f"({lmin:.4g}): implausible for a language-model ladder")
            if math.isfinite(lo) and math.isfinite(hi) and \
                    hi - lo > E_INTERVAL_MAX_FRACTION * lmin:
                why.append(f"its {level:.0%} interval [{lo:.3g}, {hi:.3g}] spans more than "
                           f"{E_INTERVAL_MAX_FRACTION:g} x the smallest loss: flat profile")
            if not have_interval:
                why.append("no interval could be computed")
        if why and p.name in (prior or {}):
            why.append("(a prior is set on it)")
        if why:
            flags[p.name] = why
    return {"flags": flags, "unidentified": sorted(k for k, w in flags.items()
                                                   if not any("prior is set" in x for x in w))}


def _lag1_autocorrelation(data, resid) -> float:
    """Pooled lag-1 autocorrelation of the residuals along each run (ordered by fraction),
    clipped to [0, 0.98]: sum r_t r_(t-1) / sum r_t^2 over consecutive points of a run."""
    num = den = 0.0
    frame = pd.DataFrame({"run": data["run"].to_numpy(), "g": data["fraction"].to_numpy(),
                          "r": resid})
    for _, grp in frame.groupby("run"):
        r = grp.sort_values("g")["r"].to_numpy()
        if r.size > 1:
            num += float(r[1:] @ r[:-1])
            den += float(r @ r)
    return float(np.clip(num / den, 0.0, 0.98)) if den > 0 else 0.0


def _backtest_starts(grid, res, order):
    """Starts of the backtest refits. A grid of up to 500 starts is used whole; a larger one
    (the Chinchilla grid) is thinned to every 20th start plus the 32 best distinct end points
    of the full fit's starts, which are local optima of a closely related objective (the
    backtest fits drop a few of the largest runs); this keeps a backtest fold ~15x cheaper
    than the full fit."""
    if len(grid) <= 500:
        return None
    ends = _distinct(res.x[order[:2000]], res.f[order[:2000]], res.x[order[0]], k=32)
    return np.vstack([grid[::20], ends])


def select_points(df: pd.DataFrame, form: Form, final_only: bool | None):
    """Rows a form is fitted on. Non-trajectory forms fit each run's final point when runs carry
    several points (intermediate points of a decaying schedule are not end points of shorter
    runs); ``final_only=False`` keeps every row (the per-fraction fits)."""
    if final_only is None:
        final_only = form.name != "trajectory"
    if df.empty:
        raise InputError("no points left to fit", field="loss")
    per_run = df.groupby("run").size()
    if final_only and per_run.max() > 1:
        idx = df.groupby("run")["fraction"].idxmax()
        out = df.loc[np.sort(idx.to_numpy())].reset_index(drop=True)
        return out, (f"the {form.name} form is fitted on each run's final point "
                     f"({len(out)} of {len(df)} points)")
    return df.reset_index(drop=True), f"all {len(df)} points"


def _required(data, form, params_column) -> dict:
    cols = {}
    for need in form.needs:
        key = params_column if need == "N" else need
        if key not in data.columns or data[key].isna().any():
            miss = int(data[key].isna().sum()) if key in data.columns else len(data)
            raise InputError(f"the {form.name} form needs this column ({miss} rows lack it)",
                             field=key)
        cols[need] = data[key].to_numpy(dtype=float)
    return cols


# Stage 1 runs every start until one iteration decreases f by less than 2.2e-6 of f (scipy's
# default L-BFGS-B test, factr 1e7, is 2.2e-9 relative to max(|f|, 1): ~2e-6 of a
# Chinchilla-size objective of ~1e-3, the same test there, but meaningless for a near-exact fit
# whose f is ~1e-7; this one is relative to f itself). Stage 2 polishes the best POLISH_TOP distinct
# candidates within POLISH_WITHIN of the best to a relative decrease below 1e-15 (the batched
# solver again: scipy's L-BFGS-B costs milliseconds per iteration in call overhead) and keeps
# the lowest.
STAGE1_FTOL = 2.2e-6
STAGE1_PATIENCE = 1
STAGE1_MAX_ITER = 300  # starts still moving after this are reported as max_iter
POLISH_FTOL = 1e-15
POLISH_TOP = 5
POLISH_WITHIN = 0.01  # only candidates within 1% of the best stage-1 objective are polished
BOOT_FTOL = 1e-9


class _Problem:
    """One fit's objective in solver coordinates. The solver works in a centred
    parametrisation: a coefficient whose term holds ``-alpha * log x`` is replaced by the term's
    value at the mean log x, which decorrelates (log A, alpha) (log x varies by a few units
    around ~20-50) and lets L-BFGS converge in several times fewer iterations. It is a linear
    change of variables, so optima are unchanged."""

    def __init__(self, model, logy, spec, delta, prior=None, prior_weight=None):
        self.model, self.logy, self.spec, self.delta = model, logy, spec, delta
        self.u0, self.M = spec.mapping()
        self.P = _centering(spec, model)
        self.Pinv = np.linalg.inv(self.P)
        names = spec.form.names
        # (full index, exp-parametrised?, mean, sd) per prior; weight = sigma^2 (see fit_one)
        self.prior = [(names.index(k), spec.form.param(k).kind != "exponent", m, sd)
                      for k, (m, sd) in (prior or {}).items()]
        self.prior_weight = float(prior_weight or 0.0)

    def fg(self, W=None, prior_means=None):
        """``prior_means`` (R, K): per-problem prior centres (the bootstrap draws them)."""
        u0, M, P = self.u0, self.M, self.P

        def fg(X, rows):
            U = u0 + (X @ P.T) @ M.T
            f, G = self.model.objective(U, self.logy, None if W is None else W[rows],
                                        self.delta)
            for k, (i, expo, mean, sd) in enumerate(self.prior):
                th = np.exp(U[:, i]) if expo else U[:, i]
                m = mean if prior_means is None else prior_means[rows, k]
                z = (th - m) / sd
                f = f + self.prior_weight * 0.5 * z * z
                G[:, i] += self.prior_weight * z / sd * (th if expo else 1.0)
            return f, (G @ M) @ P
        return fg

    def prior_precision(self, u) -> np.ndarray:
        """The priors' precision in the free u coordinates (F, F)."""
        F = self.M.shape[1]
        out = np.zeros((F, F))
        for i, expo, _m, sd in self.prior:
            d = math.exp(u[i]) if expo else 1.0          # d value / d u
            row = self.M[i]                              # which free coordinate(s) carry it
            out += np.outer(row, row) * (d / sd) ** 2
        return out

    def prior_start(self, phi):
        """``phi`` with the prior parameters moved to their prior means (one more start)."""
        u = self.spec.to_u(phi)
        for i, expo, mean, _sd in self.prior:
            u[i] = math.log(max(mean, 1e-12)) if expo else mean
        free_u = np.linalg.lstsq(self.M, u - self.u0, rcond=None)[0]
        return free_u[None]

    def solve(self, starts_phi, W=None, prior_means=None, **kw):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            r = lbfgs(self.fg(W, prior_means), np.asarray(starts_phi, dtype=float) @ self.Pinv.T,
                      **kw)
        return dataclasses.replace(r, x=r.x @ self.P.T)

    def polish(self, cands):
        """Stage 2: the candidates to tight tolerances, all at once; (phi, f) of the best."""
        r = self.solve(np.atleast_2d(cands), ftol=POLISH_FTOL, gtol=1e-13, max_iter=1000)
        f = np.where(np.isfinite(r.f), r.f, np.inf)
        i = int(np.argmin(f))
        return r.x[i], float(f[i]), r


def _centering(spec, model) -> np.ndarray:
    free = spec.free
    P = np.eye(len(free))
    tied_to = set(spec.tie.values())
    for term in spec.form.terms:
        coefs = [e for e in term if e.feature == "one"]
        if len(coefs) != 1:
            continue
        c = coefs[0].param
        if c not in free or c in tied_to or spec.form.param(c).kind != "coef":
            continue
        i = free.index(c)
        for e in term:
            if spec.form.param(e.param).kind != "exponent" or e.param in spec.fix:
                continue
            j = free.index(spec.tie.get(e.param, e.param))
            P[i, j] += -e.multiplier * float(np.mean(model.feats[e.feature]))
    return P


def _distinct(X, f, phi, k: int = 4, rtol: float = 1e-3):
    """Up to ``k`` distinct minima (first = the polished optimum) for warm starts."""
    keep = [np.asarray(phi, dtype=float)]
    for x, fx in zip(X, f, strict=True):
        if not np.isfinite(fx) or len(keep) >= k:
            continue
        if all(np.max(np.abs(x - y) / (1 + np.abs(y))) > rtol for y in keep):
            keep.append(x)
    return np.array(keep)


def _jacobian_rows(model: Model, u: np.ndarray) -> np.ndarray:
    return model.jacobian(u)


def _bootstrap(prob, runs, optima, R, seed):
    """Run-level Bayesian bootstrap: each replicate weights whole runs (all points of a run share
    its Dirichlet weight) and is refitted from the distinct optima of the full fit. Replicates
    with fewer runs of non-negligible weight than across-run parameters are degenerate and left
    out (counted)."""
    t0 = time.perf_counter()
    spec = prob.spec
    rng = np.random.default_rng(seed)
    uniq, inv = np.unique(runs, return_inverse=True)
    # Bayesian bootstrap (Rubin 1981): Dirichlet(1, ..., 1) run weights (scaled to sum to the
    # number of runs) instead of multinomial counts. Same first two moments, but every run keeps
    # a positive weight, so a 5-run ladder has no replicate that drops to 4 runs and
    # interpolates them exactly with a 4-parameter law (with counts, 114 of 200 replicates of
    # Gadre et al.'s 5-run fit were such degenerate draws)
    counts = rng.dirichlet(np.ones(len(uniq)), size=R) * len(uniq)                  # (R, U)
    k = len(optima)
    W = np.repeat(counts[:, inv].astype(float), k, axis=0)                           # (R k, n)
    means = None
    if prob.prior:  # each replicate draws its prior centre: the prior's spread enters the band
        mu = np.array([m for _i, _e, m, _s in prob.prior])
        sd = np.array([s for _i, _e, _m, s in prob.prior])
        means = np.repeat(mu + sd * rng.standard_normal((R, len(mu))), k, axis=0)
    res = prob.solve(np.tile(optima, (R, 1)), W=W, prior_means=means, ftol=BOOT_FTOL,
                     max_iter=1000)
    f = np.where(np.isfinite(res.f), res.f, np.inf).reshape(R, k)
    rows = np.arange(R) * k + f.argmin(axis=1)
    conv = res.status[rows] == 0
    n_unique = (counts > 1e-3).sum(axis=1)  # runs with a non-negligible weight
    enough = n_unique >= max(spec.n_across, 1)
    valid = enough & conv & np.isfinite(f.min(axis=1))
    U = prob.u0 + res.x[rows][valid] @ prob.M.T
    info = {"replicates": int(R), "valid": int(valid.sum()), "degenerate": int((~enough).sum()),
            "not_converged": int((enough & ~conv).sum()), "starts_per_replicate": int(k),
            "seed": int(seed), "resampled": "runs",
            "seconds": round(time.perf_counter() - t0, 3)}
    if valid.sum() < 20:
        warnings.warn(f"bootstrap: only {int(valid.sum())} of {R} replicates usable; the "
                      "bootstrap part of the bands is left out", stacklevel=3)
        return None, info
    return U, info


def _intervals(spec, u, boot_u, cov, dof, level) -> dict:
    q = 0.5 + level / 2
    out = {}
    free = spec.free
    for i, p in enumerate(spec.form.params):
        if p.name in spec.fix:
            v = float(p.to_display(u[i]))
            out[p.name] = [v, v]
            continue
        if boot_u is not None:
            d = p.to_display(boot_u[:, i])
            out[p.name] = [float(np.quantile(d, 1 - q)), float(np.quantile(d, q))]
        elif cov is not None and dof:
            j = free.index(spec.tie.get(p.name, p.name))
            h = float(stdtrit(dof, q)) * math.sqrt(max(cov[j, j], 0.0))
            out[p.name] = [float(p.to_display(u[i] - h)), float(p.to_display(u[i] + h))]
        else:
            out[p.name] = [math.nan, math.nan]
    return out


def _bound_flag(p, value) -> str | None:
    lo, hi = p.bounds
    if p.kind == "positive":  # a shape factor at 0 is legitimate: that factor is unused
        return f"at or above its upper bound {hi:g}" if value >= hi else None
    if value <= lo * (1 + 1e-6) if lo > 0 else value <= lo + 1e-6:
        return f"at or below its lower bound {lo:g}"
    if value >= hi:
        return f"at or above its upper bound {hi:g}"
    return None


def _inputs(df: pd.DataFrame) -> dict:
    cols = [c for c in ("run", "params", "active_params", "tokens", "compute", "fraction",
                        "loss") if c in df.columns]
    table = df[cols].sort_values(cols).astype(object).where(df[cols].notna(), None)
    return {"sha256": sha256_of(table.to_dict(orient="list")), "n_points": len(df),
            "n_runs": int(df["run"].nunique()), "runs": sorted(df["run"].astype(str).unique())}


def _conventions() -> dict:
    from ladder.counting import conventions
    return conventions()


def _version() -> str:
    from ladder import __version__
    return __version__
