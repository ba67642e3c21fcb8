"""One form fitted to one points table: ``fit_spec(df, spec) -> FitResult``.

Objective: Huber (delta 1e-3) of log residuals, *summed* over points (Hoffmann et al. 2022, App.
D.2, averaged it; Besiroglu et al. 2024 show the average stops L-BFGS early). Multi-start from
the form's grid (``chinchilla``: the paper's 4,500 starts) by fit.solver's batched L-BFGS, the
best candidates polished to tight tolerances.

Uncertainty, all kept in law.json (the band: ladder.fit.result): a run-level Bayesian bootstrap
(points of one run are correlated); the residual scale, dof (effective independent residuals
along each run, less the free parameters) and |log residuals|; the delta-method covariance
(plus a prior's precision). ``objective="ols"`` (the real ladder's fit): :func:`_fit_ols`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # quantiles; scipy.stats takes 0.6 s to import

from ladder.fit.allocation import allocation_diagnostics
from ladder.fit.config import FitConfig
from ladder.fit.forms import U_LIMIT, Form, Model, Spec
from ladder.fit.identify import identifiability
from ladder.fit.result import FitResult, Spread
from ladder.fit.solver import STATUS, Refits, lbfgs, percentile_interval, polish, run_bootstrap
from ladder.io import InputError, sha256_of


def fit_by(df, spec: Spec, by: str, config: FitConfig) -> FitResult:
    """One law of ``spec`` per value of column ``by`` (fractions rounded to 1e-3), in
    ``FitResult.groups``; no backtest (fit.law adds the whole law's)."""
    if by not in df.columns or df[by].isna().all():
        raise InputError(f"no column '{by}' to group by", field="by")
    key = df[by].round(3) if by == "fraction" else df[by]
    groups = []
    for i, (value, sub) in enumerate(sorted(df.groupby(key), key=lambda kv: kv[0])):
        r = fit_spec(sub.copy(), spec, replace(config, seed=config.seed + i), final_only=False)
        groups.append((float(value), r))
    if not groups:
        raise InputError("no points", field="by")
    last = groups[-1][1]
    diag = {"by": by, "n_groups": len(groups), "dropped_rows": list(df.attrs.get("dropped", [])),
            "groups": [{by: v, "params": r.params, "objective": r.diagnostics.get("objective"),
                        "converged": r.diagnostics.get("converged")} for v, r in groups]}
    return FitResult(spec=spec, u=last.u, config=config, spread=last.spread,
                     intervals=last.intervals, diagnostics=diag, inputs=_inputs(df), by=by,
                     groups=tuple(groups))


def fit_spec(df: pd.DataFrame, spec: Spec, config: FitConfig | None = None, *,
             final_only: bool | None = None, starts: np.ndarray | None = None) -> FitResult:
    """One form on one table with ``config`` (all but its ``backtest``: fit.backtest.fit_one):
    multi-start fit, bootstrap, diagnostics. ``config.bandwidth``: :func:`scale_weights`."""
    form = spec.form
    config = config or FitConfig()
    if config.objective == "ols":
        return _fit_ols(df, spec, config, final_only=final_only)
    level, delta, bandwidth, prior = config.level, config.delta, config.bandwidth, config.prior
    _check_prior(prior, spec)
    data, note = select_points(df, form, final_only)
    cols = _required(data, form, config.params_column)
    n, runs = len(data), data["run"].astype(str).to_numpy()
    uniq_runs = np.unique(runs)
    _check_enough(n, len(uniq_runs), spec)
    model = Model(form, form.features(cols))
    logy = np.log(data["loss"].to_numpy(dtype=float))
    weights = scale_weights(data, bandwidth)
    prob = _Problem(model, logy, spec, delta, weights=weights)
    grid = _start_grid(prob, starts)
    res = prob.solve(grid, ftol=STAGE1_FTOL, patience=STAGE1_PATIENCE,
                     max_iter=STAGE1_MAX_ITER)
    prior_weight = None
    if prior:
        prob, res, grid, prior_weight = _with_prior(prob, res, grid, logy, weights, prior)
    order = np.argsort(np.where(np.isfinite(res.f), res.f, np.inf))
    cands, phi, fbest, pol, box, held = _polish(prob, res, order)
    pol_best = int(np.argmin(np.where(np.isfinite(pol.f), pol.f, np.inf)))
    best = order[0]
    u = spec.to_u(phi)
    resid = logy - model.log_predict(u[None])[0]
    # distinct local optima within 10% of the best (warm starts of the bootstrap replicates)
    near10 = order[:400][res.f[order[:400]] <= fbest * 1.1]
    optima = _distinct(res.x[near10], res.f[near10], phi)

    # a weighted fit's noise is that of the runs it is local to, not the far runs' misfit
    near, sigma, dof, rho = _residual_scale(data, runs, resid, weights, spec, len(prior))
    r_near = resid[near]
    cov = _laplace_cov(model, u, prob, weights, sigma)

    boot_u, boot_info = None, {"replicates": 0}
    if config.bootstrap > 0:
        # every replicate inside law.json's range (|u| <= U_LIMIT): an unbounded one can run a
        # term off to e^-10^4, which predicts as the edge does but overflows exp() when read
        boot_u, boot_info = _bootstrap(prob, runs, optima, config.bootstrap, config.seed,
                                       bounds=box if box is not None else prob.box())

    intervals = _intervals(spec, u, boot_u, cov, dof, level)
    disp = {p.name: float(p.to_display(u[i])) for i, p in enumerate(form.params)}
    at_bound = {k: v for k, v in ((p.name, p.estimate_flag(disp[p.name])) for p in form.params
                                  if p.name in spec.free) if v}
    ident = _identifiability(spec, disp, intervals, level, data, prior, at_bound, held,
                             have_interval=cov is not None or boot_u is not None)
    diagnostics = {
        "objective": float(fbest),
        "huber_delta": delta,
        # the polish decides: a screen cut at STAGE1_MAX_ITER in a flat valley is no failure
        # when the polish converges (requiring both depended on the host's floating point,
        # issue 21)
        "converged": bool(pol.status[pol_best] == 0),
        "best_start_status": STATUS[int(res.status[best])],
        "polish_gain_rel": float((res.f[best] - fbest) / max(abs(fbest), 1e-300)),
        "starts": len(grid),
        "starts_status": {STATUS[i]: int((res.status == i).sum()) for i in range(len(STATUS))},
        "best_start": grid[best].tolist(),
        "iterations_max": int(res.iterations.max()),
        "distinct_optima": len(optima),
        "polished_candidates": len(cands),
        "at_bound": at_bound,
        "solver_box": None if box is None else {"limit": U_LIMIT, "held": held},
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
        "identifiability": ident,
        "dropped_rows": list(df.attrs.get("dropped", [])),
    }
    if weights is not None:
        diagnostics["scale_weights"] = weights_record(data, weights, bandwidth)
    if form.name == "chinchilla":
        diagnostics["allocation"] = allocation_diagnostics(disp, boot_u, spec, level)
    return FitResult(spec=spec, u=u, config=config,
                     spread=Spread(boot_u=boot_u, cov=cov, sigma=sigma, dof=dof,
                                   abs_resid=np.abs(r_near)),
                     intervals=intervals, diagnostics=diagnostics, inputs=_inputs(data),
                     starts=_backtest_starts(grid, res, order))


def _start_grid(prob: _Problem, starts: np.ndarray | None) -> np.ndarray:
    """``starts`` where given (a backtest's refits), else the spec's grid (centred if fitted so)."""
    if starts is not None:
        return np.atleast_2d(starts)
    grid = prob.spec.grid()
    return grid @ prob.P.T if prob.spec.form.centered_grid else grid


def _polish(prob: _Problem, res, order: np.ndarray) -> tuple:
    """The best distinct stage-1 solutions polished: (candidates, the optimum, its objective,
    the polish's solutions, the solver box or None, the parameters held at its edge)."""
    near = order[:400][res.f[order[:400]] <= res.f[order[0]] * (1 + POLISH_WITHIN)]
    cands = _distinct(res.x[near], res.f[near], res.x[order[0]], k=POLISH_TOP)
    phi, fbest, pol = prob.polish(cands)
    held, box = {}, None
    if not np.all(np.abs(prob.spec.to_u(phi)) <= U_LIMIT):
        # the optimum drifted along a direction the data do not pin down, beyond law.json's
        # range: polish again inside it and flag what stays at its edge
        box = prob.box()
        phi, fbest, pol = prob.polish(cands, bounds=box)
        held = prob.at_box(phi, box)
    return cands, phi, fbest, pol, box, held


def _check_enough(n: int, n_runs: int, spec: Spec) -> None:
    if n < spec.n_free or n_runs < spec.n_across:
        raise InputError(
            f"{n} points from {n_runs} runs cannot determine the {spec.n_free} free "
            f"parameters of the {spec.form.name} form ({', '.join(spec.free)}); add runs or fix "
            "parameters (--fix NAME=VALUE, --tie A=B)", field="form")


def _check_prior(prior: dict, spec: Spec) -> None:
    form = spec.form
    for k in prior:
        if k not in form.names:
            raise InputError(f"{k}: not a parameter of the {form.name} form (parameters: "
                             f"{', '.join(form.names)})", field="prior")
        if k in spec.fix:
            raise InputError(f"{k}: both fixed and given a prior", field="prior")


def _with_prior(prob: _Problem, res, grid: np.ndarray, logy: np.ndarray, weights, prior: dict):
    """The fit again with the Gaussian prior as a penalty, from the unpenalised fit ``res``:
    (problem, its solutions, their starts, the prior's weight)."""
    model, spec, delta = prob.model, prob.spec, prob.delta
    # summed Huber ~ sum r^2 / 2 = sigma^2 x NLL, so the prior's NLL is weighted by sigma^2
    # of the unpenalised residuals; with no residual dof, the Huber delta stands in for sigma
    i0 = int(np.nanargmin(np.where(np.isfinite(res.f), res.f, np.inf)))
    r0 = logy - model.log_predict(spec.to_u(res.x[i0])[None])[0]
    if weights is not None:  # the residuals of the runs the weighted fit is local to
        r0 = r0[weights >= NEAR_WEIGHT]
    s2 = float((r0 ** 2).sum() / (r0.size - spec.n_free)) if r0.size > spec.n_free else 0.0
    prior_weight = max(s2, delta ** 2)
    prob = _Problem(model, logy, spec, delta, prior=prior, prior_weight=prior_weight,
                    weights=weights)
    res = prob.solve(np.vstack([grid, prob.prior_start(res.x[i0])]), ftol=STAGE1_FTOL,
                     patience=STAGE1_PATIENCE, max_iter=STAGE1_MAX_ITER)
    grid = np.vstack([grid, grid[:1]])  # same length as res (best_start lookup below)
    return prob, res, grid, prior_weight


def _residual_scale(data: pd.DataFrame, runs: np.ndarray, resid: np.ndarray, weights,
                    spec: Spec, n_prior: int) -> tuple:
    """Lack-of-fit: (rows the scale is taken on, residual sd of log loss, its dof, lag-1
    autocorrelation along a run); None for what cannot be had. A prior adds one dof."""
    n = len(data)
    near = np.ones(n, dtype=bool) if weights is None else weights >= NEAR_WEIGHT
    n_near, r_near = int(near.sum()), resid[near]
    multi = data.groupby("run").size().max() > 1
    rho = None
    if multi:
        # dof: the effective sample size of AR(1) residuals along each run, n (1 - rho) /
        # (1 + rho), less the free parameters; never below the across-run count
        rho = _lag1_autocorrelation(data[near], r_near)
        n_eff = n_near * (1 - rho) / (1 + rho)
        dof = max(n_eff + n_prior - spec.n_free,
                  len(np.unique(runs[near])) + n_prior - spec.n_across)
    else:
        dof = n_near + n_prior - spec.n_free
    sigma = float(np.sqrt((r_near ** 2).sum() / (n_near + n_prior - spec.n_free))) \
        if n_near + n_prior > spec.n_free else None
    dof = float(dof) if dof > 0 else None
    return near, sigma, dof, rho


def _laplace_cov(model: Model, u: np.ndarray, prob: _Problem, weights, sigma) -> np.ndarray | None:
    """The covariance of the solver's parameters by the Laplace approximation, or None."""
    if sigma is None or sigma <= 0:
        return None
    J = model.jacobian(u) @ prob.M
    if weights is not None:  # the weighted objective's curvature: J' W J
        J = J * np.sqrt(weights)[:, None]
    # the prior's precision adds to J'J / sigma^2. pinv: a shape factor at 0 leaves a flat
    # direction, not propagated; hermitian (eigh): rounding cannot leave a negative variance
    H = J.T @ J / sigma ** 2 + prob.prior_precision(u)
    cov = np.linalg.pinv((H + H.T) / 2, rcond=1e-12, hermitian=True)
    return cov if np.all(np.isfinite(cov)) else None


def ols(y: np.ndarray, X: np.ndarray) -> OlsFit:
    """Ordinary least squares of ``y`` on ``X`` (with its own constant column) through QR: what
    statsmodels' ``OLS(y, X).fit()`` reports (75 MB of install for these lines; a test checks
    they agree to 1e-10). Covariance ``SSR / (n - p) (X'X)^-1``."""
    n, p = X.shape
    q, r = np.linalg.qr(X)
    beta = np.linalg.solve(r, q.T @ y)
    resid = y - X @ beta
    ssr = float(resid @ resid)
    dof = n - p
    r_inv = np.linalg.inv(r)
    scale = ssr / dof if dof > 0 else math.nan
    cov = scale * (r_inv @ r_inv.T)
    centred = y - y.mean()
    tss = float(centred @ centred)
    return OlsFit(params=beta, cov=cov, ssr=ssr, df_resid=dof, scale=scale,
                  rsquared=1.0 - ssr / tss if tss > 0 else math.nan)


@dataclasses.dataclass(frozen=True)
class OlsFit:
    """One OLS fit (:func:`ols`); ``conf_int`` is Student-t with ``df_resid`` dof."""

    params: np.ndarray
    cov: np.ndarray
    ssr: float
    df_resid: int
    scale: float
    rsquared: float

    def conf_int(self, alpha: float) -> np.ndarray:
        half = float(stdtrit(self.df_resid, 1 - alpha / 2)) * np.sqrt(np.diag(self.cov))
        return np.column_stack([self.params - half, self.params + half])


def _fit_ols(df, spec, config, *, final_only):
    """The real ladder's fit: OLS of log(L - E) on log C with E fixed and the Student-t
    interval (n - 2 dof) its team asked for; log A = intercept, alpha = -slope."""
    data, note = select_points(df, spec.form, final_only)
    cols = _required(data, spec.form, config.params_column)
    E = float(spec.fix["E"])
    L = data["loss"].to_numpy(dtype=float)
    if np.any(L <= E):
        raise InputError(f"ols needs every loss above the fixed E={E:g} (log(L - E)); "
                         f"{int((L <= E).sum())} are not", field="loss")
    n = len(data)
    if n < 2:
        raise InputError(f"{n} point cannot determine the 2 ols parameters (log A, alpha)",
                         field="form")
    fit = ols(np.log(L - E), np.column_stack([np.ones(n), np.log(cols["compute"])]))
    b0, b1 = (float(v) for v in fit.params)
    D = np.diag([1.0, -1.0])                      # (log A, slope) -> (log A, alpha)
    dof = float(fit.df_resid) if fit.df_resid > 0 else None
    sigma = float(np.sqrt(fit.scale)) if dof else None
    cov = D @ np.asarray(fit.cov) @ D if dof else None
    u = spec.to_u(np.array([b0, -b1]))
    intervals = {"E": [E, E]}
    if dof:
        ci = np.asarray(fit.conf_int(alpha=1 - config.level))
        intervals["A"] = [float(np.exp(ci[0, 0])), float(np.exp(ci[0, 1]))]
        intervals["alpha"] = [float(-ci[1, 1]), float(-ci[1, 0])]
    else:
        intervals["A"] = intervals["alpha"] = [math.nan, math.nan]
    resid = np.log(L) - Model(spec.form, spec.form.features(cols)).log_predict(u[None])[0]
    diagnostics = {
        "objective": float(fit.ssr), "objective_kind": "ols: sum of squared residuals of "
        "log(L - E) on log C", "converged": True, "free": list(spec.free),
        "at_bound": {}, "n_points": n, "n_runs": int(data["run"].nunique()),
        "fraction_range": [float(data["fraction"].min()), float(data["fraction"].max())],
        "points_note": note, "rmse_log": float(np.sqrt(np.mean(resid ** 2))),
        "max_abs_rel_residual": float(np.max(np.abs(np.expm1(-resid)))),
        "dof": dof, "sigma_log": sigma, "rsquared": float(fit.rsquared) if n > 2 else None,
        "bootstrap": {"replicates": 0, "note": "ols: Student-t interval only"},
        "dropped_rows": list(df.attrs.get("dropped", [])),
    }
    return FitResult(spec=spec, u=u, config=config,
                     spread=Spread(cov=cov, sigma=sigma, dof=dof), intervals=intervals,
                     diagnostics=diagnostics, inputs=_inputs(data))


# Published LM ladders put E at 55-90% of the losses they fit (Hoffmann et al. 2022: 1.69 against
# ~2-3; Besiroglu et al. 2024: 1.82; Marin fixes 1.5 against 2.4-3.0): E below half the smallest
# loss is implausible. An interval wider than half of (0, min loss) does not pin E down.
E_MIN_FRACTION_OF_LOSS = 0.5
E_INTERVAL_MAX_FRACTION = 0.5


def implausible_asymptote(E: float, lmin: float) -> str | None:
    """Why ``E`` is implausible below a smallest fitted loss ``lmin``, or None (the one test of
    the identifiability flags and of fit.law's asymptote rule)."""
    if E >= lmin:
        return f"E = {E:.4g} is not below the smallest loss {lmin:.4g}"
    if E < E_MIN_FRACTION_OF_LOSS * lmin:
        return (f"E = {E:.4g} is below {E_MIN_FRACTION_OF_LOSS:g} x the smallest loss "
                f"({lmin:.4g}): implausible for a language-model ladder")
    return None


def _identifiability(spec, disp, intervals, level, data, prior, at_bound, held,
                     have_interval) -> dict:
    """fit.identify.identifiability with this family's checks: a fit through its points, the
    free parameters ``at_bound`` of their range or ``held`` at the solver box's edge, and an
    implausible or flat asymptote (``disp``: the parameters, display space)."""
    form = spec.form
    lmin = float(data["loss"].min())
    # as many free parameters as points: every draw is the same law, a zero-width interval
    exact = len(data) + len(prior or {}) <= spec.n_free
    before = [f"the fit has no residual degrees of freedom ({len(data)} points, "
              f"{spec.n_free} free parameters): it passes through its points"] if exact else []
    free = [p for p in form.params if p.name in spec.free]
    estimate = {}
    for p in free:
        why = [f"estimate {at_bound[p.name]}"] if p.name in at_bound else []
        if p.name in held:
            why.append(f"held at the {held[p.name]} of the solver's box (law.json's range, "
                       f"|u| <= {U_LIMIT:g}): the data do not pin it down")
        estimate[p.name] = why
    after = {}
    if "E" in spec.free:
        E = disp["E"]
        lo, hi = intervals.get("E", [math.nan, math.nan])
        why = [bad] if (bad := implausible_asymptote(E, lmin)) else []
        if math.isfinite(lo) and math.isfinite(hi) and hi - lo > E_INTERVAL_MAX_FRACTION * lmin:
            why.append(f"its {level:.0%} interval [{lo:.3g}, {hi:.3g}] spans more than "
                       f"{E_INTERVAL_MAX_FRACTION:g} x the smallest loss: flat profile")
        if not have_interval:
            why.append("no interval could be computed")
        after["E"] = why
    return identifiability(free, intervals, level, estimate=estimate, before=before,
                           after=after, prior=prior or {})


def run_scales(df: pd.DataFrame) -> tuple[pd.Series, str]:
    """log10 of every run's scale, and what the scale is: "compute" (planned total FLOPs),
    "params_x_tokens", "params", or "1/loss" (no scale column: ordered by final loss)."""
    g = df.groupby("run")
    if "compute" in df.columns and df["compute"].notna().all():
        s, kind = g["compute"].max() / g["fraction"].max().clip(lower=1e-12), "compute"
    elif {"params", "tokens"} <= set(df.columns) and df[["params", "tokens"]].notna().all().all():
        s, kind = g["params"].max() * g["tokens"].max(), "params_x_tokens"
    elif "params" in df.columns and df["params"].notna().all():
        s, kind = g["params"].max(), "params"
    else:
        s, kind = 1.0 / g["loss"].min(), "1/loss"
    return np.log10(s.astype(float)), kind


# A Chinchilla-family form holds only locally (its exponents drift with scale), so runs decades
# below the top can pull its slope there (Porian et al.'s IsoFLOP grid: the 12th budget missed
# by +6.5% from the 11 smaller, +0.9% from the 2 largest; docs/LOG.md). A Gaussian kernel in
# decades below the largest run is a local fit at the top in which every run keeps a weight.
# fit.law.scale_weight_rule chooses the bandwidth. NEAR_WEIGHT: the runs a weighted fit is local to.
NEAR_WEIGHT = 0.5


def scale_weights(data: pd.DataFrame, bandwidth: float | None) -> np.ndarray | None:
    """Per-row weights exp(-d^2 / 2 h^2), d the decades of the row's run below the largest
    run's scale (:func:`run_scales`), h = ``bandwidth``; None without one."""
    if bandwidth is None:
        return None
    h = float(bandwidth)
    if not (math.isfinite(h) and h > 0):
        raise InputError(f"must be a positive number of decades, got {bandwidth!r}",
                         field="bandwidth")
    logs, _ = run_scales(data)
    d = float(logs.max()) - data["run"].map(logs).to_numpy(dtype=float)
    return np.exp(-0.5 * (d / h) ** 2)


def weights_record(data: pd.DataFrame, weights: np.ndarray, bandwidth: float) -> dict:
    """What law.json says about a weighted fit (``diagnostics.scale_weights``)."""
    logs, kind = run_scales(data)
    per_run = pd.Series(weights, index=data["run"].to_numpy()).groupby(level=0).max()
    return {"method": "Gaussian kernel in decades below the largest run's scale",
            "scale": kind, "bandwidth_decades": float(bandwidth),
            "top_scale_log10": float(logs.max()),
            "effective_runs": float(per_run.sum() ** 2 / (per_run ** 2).sum()),
            "near_runs": int((per_run >= NEAR_WEIGHT).sum()), "near_weight": NEAR_WEIGHT,
            "smallest_weight": float(per_run.min())}


def _lag1_autocorrelation(data, resid) -> float:
    """Pooled lag-1 autocorrelation of the residuals along each run, clipped to [0, 0.98]."""
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
    """Starts of the backtest refits: a grid over 500 starts thinned to every 20th plus the
    full fit's 32 best distinct end points (a fold ~15x cheaper); None: the grid whole."""
    if len(grid) <= 500:
        return None
    ends = _distinct(res.x[order[:2000]], res.f[order[:2000]], res.x[order[0]], k=32)
    return np.vstack([grid[::20], ends])


def select_points(df: pd.DataFrame, form: Form, final_only: bool | None):
    """Rows a form is fitted on, and a note: each run's final point unless the form models
    curves (a decaying schedule's middle is no shorter run's end) or ``final_only=False``."""
    if final_only is None:
        final_only = not form.curves
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


# Stage 1 stops a start when an iteration decreases f by less than 2.2e-6 of f (scipy's factr 1e7
# test, but relative to f itself, not max(|f|, 1): a near-exact fit's f is ~1e-7). Stage 2
# polishes the best POLISH_TOP distinct candidates within POLISH_WITHIN to 1e-15.
STAGE1_FTOL = 2.2e-6
STAGE1_PATIENCE = 1
STAGE1_MAX_ITER = 300  # starts still moving after this are reported as max_iter
POLISH_FTOL = 1e-15
POLISH_TOP = 5
POLISH_WITHIN = 0.01  # only candidates within 1% of the best stage-1 objective are polished
BOOT_FTOL = 1e-9
# Values of one (problems x points) array an objective evaluation holds at a time (32 MB): all
# problems at once on a large table was 4,500 x 300,000 = 10.8 GB (issue 26's MemoryError).
CHUNK_VALUES = 1 << 22


class _Problem:
    """One fit's objective in solver coordinates, centred: a coefficient of a term with
    ``-alpha * log x`` is replaced by the term's value at the mean log x, which decorrelates
    (log A, alpha) and converges several times faster (linear, so optima are unchanged)."""

    def __init__(self, model, logy, spec, delta, prior=None, prior_weight=None, weights=None):
        self.model, self.logy, self.spec, self.delta = model, logy, spec, delta
        self.weights = None if weights is None else np.asarray(weights, dtype=float)[None, :]
        self.u0, self.M = spec.mapping()
        self.P = _centering(spec, model)
        self.Pinv = np.linalg.inv(self.P)
        names = spec.form.names
        # (full index, exp-parametrised?, mean, sd) per prior; weight = sigma^2 (see fit_one)
        self.prior = [(names.index(k), spec.form.param(k).kind != "exponent", m, sd)
                      for k, (m, sd) in (prior or {}).items()]
        self.prior_weight = float(prior_weight or 0.0)

    def fg(self, W=None, prior_means=None):
        """``W(rows)``: those problems' point weights; ``prior_means`` (R, K): per-problem prior
        centres (the bootstrap draws both)."""
        u0, M, P = self.u0, self.M, self.P

        def fg(X, rows):
            step = max(1, CHUNK_VALUES // max(len(self.logy), 1))
            if len(rows) <= step:
                return one(X, rows)
            parts = [one(X[a:a + step], rows[a:a + step]) for a in range(0, len(rows), step)]
            return (np.concatenate([p[0] for p in parts]),
                    np.concatenate([p[1] for p in parts]))

        def one(X, rows):
            U = u0 + (X @ P.T) @ M.T
            Wr = None if W is None else W(rows)
            if self.weights is not None:
                Wr = self.weights if Wr is None else Wr * self.weights
            f, G = self.model.objective(U, self.logy, Wr, self.delta)
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

    def polish(self, cands, bounds=None):
        """Stage 2: the candidates to tight tolerances, all at once; (phi, f) of the best.
        ``bounds``: (lo, hi) in the solver's coordinates (:meth:`box`)."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            i, r = polish(self.fg(), np.atleast_2d(cands) @ self.Pinv.T, ftol=POLISH_FTOL,
                           gtol=1e-13, max_iter=1000, bounds=bounds)
        r = dataclasses.replace(r, x=r.x @ self.P.T)
        return r.x[i], float(r.f[i]), r

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        """Bounds in the solver's coordinates keeping every free |u| <= U_LIMIT: coefficients
        and factors get U_LIMIT / 2 (e^-350 is 0 beside any loss), exponents the other half over
        the largest sum of mean log inputs (|exponent| <= ~6 at 1e25 FLOPs; forms bound 3)."""
        kinds = [self.spec.form.param(n).kind for n in self.spec.free]
        half = U_LIMIT / 2
        reach = float(np.abs(self.P - np.eye(len(kinds))).sum(axis=1).max()) if kinds else 0.0
        lim = [(half / reach if reach > 0 else half) if k == "exponent" else half
               for k in kinds]
        return -np.array(lim), np.array(lim)

    def at_box(self, phi, box) -> dict:
        """{name: "lower bound" | "upper bound"} of the free parameters at ``box``'s edge (a
        shape factor at 0 is legitimate, not flagged)."""
        x = np.asarray(phi) @ self.Pinv.T
        out = {}
        for j, n in enumerate(self.spec.free):
            kind = self.spec.form.param(n).kind
            tol = 1e-9 * max(1.0, abs(box[0][j]))
            if x[j] <= box[0][j] + tol and kind != "positive":
                out[n] = "lower bound"
            elif x[j] >= box[1][j] - tol:
                out[n] = "upper bound"
        return out


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


def _bootstrap(prob, runs, optima, R, seed, bounds=None):
    """Run-level Bayesian bootstrap (fit.solver.run_bootstrap), each replicate refitted from the
    full fit's distinct optima; degenerate replicates (fewer weighted runs than across-run
    parameters) left out. Fewer than 20 usable: none (the band uses the delta method)."""
    spec = prob.spec
    uniq, inv = np.unique(runs, return_inverse=True)
    k = len(optima)

    def refit(counts, rng):
        # the (R k, n) point weights, built for the rows asked for (whole: 1.9 GB at 300,000 rows)
        def W(rows):
            return counts[np.asarray(rows) // k][:, inv].astype(float)

        means = None
        if prob.prior:  # each replicate draws its prior centre: the prior's spread enters the band
            mu = np.array([m for _i, _e, m, _s in prob.prior])
            sd = np.array([s for _i, _e, _m, s in prob.prior])
            means = np.repeat(mu + sd * rng.standard_normal((R, len(mu))), k, axis=0)
        res = prob.solve(np.tile(optima, (R, 1)), W=W, prior_means=means, ftol=BOOT_FTOL,
                         max_iter=1000, bounds=bounds)
        f = np.where(np.isfinite(res.f), res.f, np.inf).reshape(R, k)
        rows = np.arange(R) * k + f.argmin(axis=1)
        conv = res.status[rows] == 0
        n_unique = (counts > 1e-3).sum(axis=1)  # runs with a non-negligible weight
        enough = n_unique >= max(spec.n_across, 1)
        valid = enough & conv & np.isfinite(f.min(axis=1))
        return Refits(draws=prob.u0 + res.x[rows][valid] @ prob.M.T, valid=int(valid.sum()),
                      degenerate=int((~enough).sum()), not_converged=int((enough & ~conv).sum()),
                      record={"starts_per_replicate": int(k)})

    return run_bootstrap(len(uniq), R, seed, refit, usable=20,
                     without="the bootstrap part of the bands is left out")


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
            out[p.name] = [float(v) for v in percentile_interval(p.to_display(boot_u[:, i]),
                                                                 level)]
        elif cov is not None and dof:
            j = free.index(spec.tie.get(p.name, p.name))
            h = float(stdtrit(dof, q)) * math.sqrt(max(cov[j, j], 0.0))
            out[p.name] = [float(p.to_display(u[i] - h)), float(p.to_display(u[i] + h))]
        else:
            out[p.name] = [math.nan, math.nan]
    return out


def _inputs(df: pd.DataFrame) -> dict:
    cols = [c for c in ("run", "params", "active_params", "tokens", "compute", "fraction",
                        "loss") if c in df.columns]
    table = df[cols].sort_values(cols).astype(object).where(df[cols].notna(), None)
    return {"sha256": sha256_of(table.to_dict(orient="list")), "n_points": len(df),
            "n_runs": int(df["run"].nunique()), "runs": sorted(df["run"].astype(str).unique())}


