"""Fitting a law to a points table: ``fit_law(df, FitConfig(...))``, the package's entry point,
with ``fit_task`` and ``compare_points``, which chain or pair its laws, and the law.json readers
keyed by form (``load_law``).

fit_law hands the table to the form's fitter: a curve law (fit.curve_fit), ``--form auto``
(below), one form (fit.backtest.fit_one) or one law per value of a column (``--by``); then the
forecast layer's passes (the scale-weight and asymptote rules, below), each a new result.

``--form auto``'s candidates (:func:`candidates`): ``compute``, ``chinchilla``, ``chinchilla``
with alpha = beta (Gadre et al. 2024's E + (a M^eta + b M^-eta) C^-eta), ``moe`` and
``trajectory``, where their columns are. The winner has the lowest rollout error at the held-out
runs' final points or, among the forms of final points, is the simplest within one standard
error of it (one_se_choice); a form that cannot be backtested wins only when none can.

Layers inside ladder/fit/, bottom to top: forms, identify, config, solver, prediction, points,
lr_schedules, curve_forms, allocation, report -> lawjson, compare -> result -> curve_law,
task_law, estimate -> backtest, curve_fit, task -> law.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd

import ladder.fit.lawjson as lawjson
import ladder.fit.task as task
from ladder.fit.backtest import (EXTRAPOLATION_POWER, backtest, fit_one, scale_inputs,
                                 scale_levels, summarise_folds, trajectory_vs_per_fraction,
                                 with_power)
from ladder.fit.compare import COMPARE_FORMS, MIN_PAIRS, Comparison, compare_laws
from ladder.fit.config import FitConfig
from ladder.fit.curve_fit import curve_data_from_table, fit_curve_law
from ladder.fit.curve_forms import FORMS as _CURVE_LAW_FORMS
from ladder.fit.estimate import (NEAR_WEIGHT, fit_by, implausible_asymptote, run_scales,
                                 select_points)
from ladder.fit.forms import CURVES_FORMS, FORMS, Spec, form_choices, get_form
from ladder.fit.points import COLUMNS, load_points
from ladder.fit.prediction import Prediction
from ladder.fit.result import FitResult, LawResult
from ladder.fit.task_law import SKIP, SMOOTH, TaskLaw
from ladder.io import EX_USAGE, InputError, read_json

CURVE_FORMS = tuple(_CURVE_LAW_FORMS)  # schedule-aware curve laws (fit.curve_forms): mpl, momentum
# The most points one fit takes (issue 26): memory is bounded (fit.estimate.CHUNK_VALUES) but time
# grows with the points (2,000 took 35 s of CPU); a ladder needs far fewer (4 rungs x 20 fractions).
MAX_FIT_ROWS = 100_000

__all__ = ["CURVE_FORMS", "FitConfig", "FitResult", "LawResult", "Prediction", "compare_points",
           "fit_law", "fit_task", "law_from_json", "laws_from_json", "load_law", "load_laws"]


def fit_law(df, config: FitConfig | None = None, **changes) -> FitResult:
    """Fit the law ``config`` asks for (default ``FitConfig()``; ``changes`` are its fields by
    name: ``fit_law(df, form="compute")``) to the points table ``df`` (fit.load_points; files
    or a bare DataFrame are read through it).

    A named form gives that form's own estimator (Epoch's refit). The forecast-only devices
    (None: on for ``form="auto"``, off for a named form), :func:`scale_weight_rule` and then
    :func:`asymptote_rule`, move the estimates only in the forecast layer, which keeps the
    form's own beside them in ``diagnostics.forecast_layer`` (docs/scoreboard.md: 0.174 -> 0.124
    aggregate interval score). ``band_prior`` (opt-in; True: ``BAND_PRIOR``) and
    ``extrapolation_power`` (None: EXTRAPOLATION_POWER for ``form="auto"``, the rate per decade
    for a named form) shape the band only (fit.result)."""
    config = replace(config or FitConfig(), **changes)  # an unknown field: TypeError
    metric, by, form = config.metric, config.by, config.form
    if metric is None and _plain_loss(df):
        metric = "loss"  # a notebook's own table: its column keeps the name it was given
    if not isinstance(df, pd.DataFrame) or not set(COLUMNS) <= set(df.columns):
        df = load_points(df, metric)  # files, or a bare DataFrame: normalise and clean it
    largest = len(df) if by is None or by not in df.columns or not len(df) else \
        int(df.groupby(by).size().max())
    if largest > MAX_FIT_ROWS:
        raise InputError(f"{largest:,} points in one fit: more than the {MAX_FIT_ROWS:,} a fit "
                         f"takes (its time grows with the points); thin the table (e.g. a run's "
                         f"points every 1% of its progress) or fit parts of it with --by",
                         field="rows")
    config = replace(config, metric=metric or df.attrs.get("metric") or "loss")
    fix, tie, prior, objective = config.fix, config.tie, config.prior, config.objective
    if objective == "ols" and (form != "compute" or set(fix) != {"E"} or tie or prior):
        raise InputError("ols is least squares of log(L - E) on log C: it needs --form compute "
                         "with E fixed (--fix E=VALUE) and no --tie or --prior",
                         field="objective")
    if form in CURVE_FORMS:  # schedule-aware curve laws live in ladder.fit.curve_fit
        if tie or by or prior or objective != "huber":
            raise InputError(f"the {form} form takes no --tie, --by, --prior or --objective",
                             field="form")
        return _left_out(fit_curve_law(df, form=form, bootstrap=config.bootstrap,
                                       level=config.level, seed=config.seed,
                                       metric=config.metric, fix=fix or None), df)
    if by is not None:
        return _left_out(_fit_by(df, config), df)
    auto = form == "auto"
    res = fit_auto(df, config) if auto else fit_one(df, _spec(form, fix, tie), config)
    plain = res
    rules = objective == "huber" and config.backtest and isinstance(res, FitResult)
    if rules and (auto if config.scale_weighting is None else config.scale_weighting):
        res = scale_weight_rule(df, res, config)
    if rules and (auto if config.asymptote_rule is None else config.asymptote_rule):
        bw = (res.diagnostics.get("scale_weighting") or {}).get("bandwidth")
        res = asymptote_rule(df, res, replace(config, bandwidth=bw))
    if isinstance(res, FitResult):
        res = _forecast_layer(res, plain, config.band_prior)
        power = config.extrapolation_power
        if power is None and auto:
            power = EXTRAPOLATION_POWER
        if power is not None and "backtest" in res.diagnostics:
            res = res.with_diagnostics(backtest=with_power(res.diagnostics["backtest"], power))
    return _left_out(res, df)


def _plain_loss(df) -> bool:
    """A DataFrame built by hand with a plain ``loss`` column and no metric named."""
    return isinstance(df, pd.DataFrame) and "loss" in df.columns and \
        "metric" not in df.columns and not df.attrs.get("metric")


# The band's prior (fit.result.band_prior_of): medians over bench/scoreboard.py's 12 public
# ladders of each plain fit's noise log sd and extrapolation rate per decade (the scoreboard learns
# them leave-one-ladder-out). weight 9: the fewest points a 90% residual quantile can rank.
BAND_PRIOR_WEIGHT = 9.0
BAND_PRIOR = {"noise_log_sd": 0.00628, "rate": 0.0401, "weight": BAND_PRIOR_WEIGHT, "source": "bench/scoreboard.py: medians over its 12 public ladders' plain fits"}  # noqa: E501


def _forecast_layer(res, plain, band_prior) -> FitResult:
    """``res`` with ``diagnostics.forecast_layer``: the band's prior, and the form's own
    estimates beside those a device moved, so law.json says which numbers are which."""
    layer, new = {}, {}
    if band_prior is True:
        band_prior = BAND_PRIOR
    if band_prior:
        new["band_prior"] = dict(band_prior)
        layer["band"] = ("noise and extrapolation terms pooled with their cross-ladder values "
                         "(diagnostics.band_prior); the estimates are not moved")
    devices = [k for k in ("scale_weighting", "asymptote_rule")
               if (res.diagnostics.get(k) or {}).get("applied")
               and (res.diagnostics.get(k) or {}).get("chosen") not in (None, "free",
                                                                         "equal weights")]
    if devices:  # a device that moved the estimates: res is another fit than plain
        layer["devices"] = devices
        layer["estimator_params"] = {k: float(v) for k, v in plain.params.items()}
        layer["estimates"] = ("params are the forecast's (moved by " + ", ".join(devices)
                              + "); the form's own estimator gave estimator_params")
        if "allocation" in plain.diagnostics:
            # an allocation sizes a run: it is the form's exponents', never a device's
            new["allocation"] = dict(plain.diagnostics["allocation"],
                                     source="the form's own estimator")
    else:
        layer["estimates"] = "params are the form's own estimator"
    return res.with_diagnostics(**new, forecast_layer=layer)


def _left_out(res, df):
    """The runs the table's reader left out (a ladder's target) into ``inputs.left_out``."""
    left = list(df.attrs.get("left_out") or [])
    return replace(res, inputs={**res.inputs, "left_out": left}) if left else res


def _spec(form: str, fix: dict, tie: dict) -> Spec:
    if form == "task":
        raise InputError("the task form fits in two steps: ladder.fit.fit_task (the CLI: "
                         "--form task --via LOSS_KEY)", field="form")
    if form not in FORMS:
        raise InputError(f"unknown form {form!r}; one of {form_choices()} (*: tried by --form "
                         "auto)", field="form")
    try:
        return Spec(get_form(form), fix=fix, tie=tie)
    except ValueError as e:
        raise InputError(str(e), field="fix" if fix else "tie") from None


def _fit_by(df, config) -> FitResult:
    """``--by``: one law per value (ladder.fit.estimate.fit_by) and the whole law's backtest."""
    if config.form == "auto":
        raise InputError("--by needs an explicit --form", field="by")
    spec, by = _spec(config.form, config.fix, config.tie), config.by
    res = fit_by(df, spec, by, config)
    if not config.backtest:
        return res
    new = {"backtest": backtest(df, spec, config.refit(), by=by)}
    if by == "fraction" and spec.form.name == "compute" and set(spec.fix) == {"E"}:
        try:
            new["trajectory_vs_per_fraction"] = trajectory_vs_per_fraction(
                df, config, per_fraction_bt=new["backtest"], E=float(spec.fix["E"]))
        except InputError as e:
            new["trajectory_vs_per_fraction"] = {"error": str(e)}
    return res.with_diagnostics(**new)


# ----------------------------------------------------------------------------- --form auto
# The compute form holds at a fixed tokens-per-parameter ratio, not across runs over-trained by
# different multiples (Gadre et al.'s M = 20..640: +6.6% off at 6.9B, yet it won the rollout by
# noise); runs whose tokens/params spread more than this factor exclude it.
MAX_TOKENS_PER_PARAM_SPREAD = 2.0


def candidates(df, fix: dict, tie: dict, params_column: str,
               excluded: dict | None = None) -> list[tuple[str, Spec]]:
    have = {c for c in df.columns if df[c].notna().all()}
    out = []
    excluded = {} if excluded is None else excluded

    def add(label, form, tie_extra=None):
        t = {**tie, **(tie_extra or {})}
        f = get_form(form)
        fx = {k: v for k, v in fix.items() if k in f.names}
        tt = {k: v for k, v in t.items() if k in f.names and v in f.names}
        try:
            out.append((label, Spec(f, fix=fx, tie=tt)))
        except ValueError:
            pass

    if "compute" in have:
        spread = None
        if {params_column, "tokens"} <= have:
            last = df.loc[df.groupby("run")["fraction"].idxmax()] if "fraction" in have else df
            m = (last["tokens"] / last[params_column]).to_numpy(dtype=float)
            spread = float(m.max() / m.min()) if m.size else None
        if spread is not None and spread > MAX_TOKENS_PER_PARAM_SPREAD:
            excluded["compute"] = (f"runs differ {spread:.0f}x in tokens per parameter: the loss "
                                   "is not a function of compute alone")
        else:
            add("compute", "compute")
    if {params_column, "tokens"} <= have:
        add("chinchilla", "chinchilla")
        add("chinchilla (alpha=beta)", "chinchilla", {"alpha": "beta"})
    if {"params", "active_params", "tokens"} <= have and \
            not np.allclose(df["params"], df["active_params"]):
        add("moe", "moe")
    if {"compute", "fraction"} <= have and df.groupby("run")["fraction"].nunique().max() > 2:
        add("trajectory", "trajectory")
    return out


def _curve_table(df) -> bool:
    """Whole curves of several runs with their LR schedule: the curve laws apply."""
    return {"step", "lr", "loss"} <= set(df.columns) and bool(
        df["step"].notna().all() and df["lr"].notna().any() and df["run"].nunique() >= 2)


def fit_auto_curves(df, config):
    """``--form auto`` on curves without scale columns: the multi-power law (Luo et al. 2025)
    or the momentum law (Tissue et al. 2024), by leave-one-run-out curve error."""
    data, fix = curve_data_from_table(df, size_column="active_params"), config.fix
    rows, best = [], None
    for form in ("mpl", "momentum"):
        errs = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for i, name in enumerate(data.names):
                    train = df[df["run"].astype(str) != name]
                    law = fit_curve_law(train, form, bootstrap=0, fix=fix or None)
                    pred = law.predict(schedule=data.lr[i], step=data.steps[i])
                    errs.append(float(np.mean(np.abs(pred.loss / data.loss[i] - 1.0))))
        except InputError as e:
            rows.append({"form": form, "error": str(e)})
            continue
        err = float(np.mean(errs))
        rows.append({"form": form, "leave_one_run_out_mean_abs_curve": err,
                     "per_run": dict(zip(data.names, errs, strict=True))})
        if best is None or err < best[1]:
            best = (form, err)
    if best is None:
        raise InputError("no curve law could be fitted: " + "; ".join(r["error"] for r in rows),
                         field="form")
    law = fit_curve_law(df, best[0], bootstrap=config.bootstrap, level=config.level,
                        seed=config.seed, metric=config.metric, fix=fix or None)
    return law.with_diagnostics(auto={
        "chosen": best[0], "candidates": rows,
        "why": f"lowest leave-one-run-out error over held-out curves ({100 * best[1]:.3f}%; "
               + ", ".join(f"{r['form']} {100 * r['leave_one_run_out_mean_abs_curve']:.3f}%"
                           for r in rows if "error" not in r)
               + "); curve laws are the candidates because the table has step and lr but no "
                 "compute, nor params and tokens"})


def held_out_errors(r) -> dict:
    """{held-out run: |relative error| of its final point} over ``r``'s rollout folds."""
    out = {}
    for f in ((r.diagnostics.get("backtest") or {}).get("folds") or []):
        for run, e in zip(f.get("final_runs") or [], f.get("final_rel_err") or [], strict=True):
            if isinstance(e, (int, float)) and np.isfinite(e):
                out[str(run)] = abs(float(e))
    return out


def one_se_choice(errs: dict, order: list):
    """The first candidate of ``order`` (simplest first) whose mean held-out error is within
    one standard error of the lowest (Breiman et al. 1984, CART 3.4.3; Hastie et al., ESL
    7.10). ``errs``: {candidate: {run: |error|}}, compared on the runs all of them predicted.
    Returns (choice, {candidate: (mean, se)}, runs compared); (None, {}, n) below 2 runs."""
    common = sorted(set.intersection(*(set(e) for e in errs.values()))) if errs else []
    if len(common) < 2:
        return None, {}, len(common)
    stats = {}
    for k, e in errs.items():
        v = np.array([e[r] for r in common])
        stats[k] = (float(v.mean()), float(v.std(ddof=1) / np.sqrt(v.size)))
    best = min(stats, key=lambda k: stats[k][0])
    limit = stats[best][0] + stats[best][1]
    return next(k for k in order if stats[k][0] <= limit), stats, len(common)


def _simplest_within_one_se(scored: list, fitted: dict, lowest: str):
    """(form, why): among the forms of final points, the simplest within one standard error of
    the lowest rollout error (:func:`one_se_choice`); None when the lowest is a curve form or
    nothing compares. A flexible form wins a few-run rollout by noise and extrapolates worse
    (Gadre et al.'s RedPajama ladder: free exponents won, 0.73% against 0.83%, and missed 6.9B
    by -3.0%, the tied form by +0.3%; docs/LOG.md, 2026-12-02)."""
    rows = [r for r in scored if not fitted[r["form"]][0].form.curves]
    if not any(r["form"] == lowest for r in rows) or len(rows) < 2:
        return None
    order = [r["form"] for r in sorted(rows, key=lambda r: (r["n_free"],
                                                            r["rollout_mean_abs_final"]))]
    choice, stats, n = one_se_choice({f: held_out_errors(fitted[f][1]) for f in order}, order)
    if choice is None:
        return None
    for r in rows:
        r["one_se"] = {"mean_abs_final": stats[r["form"]][0], "se": stats[r["form"]][1],
                       "held_out": n}
    nfree = {r["form"]: r["n_free"] for r in rows}
    return choice, (f"the form with the fewest free parameters whose rollout error at the "
                    f"{n} held-out final points is within one standard error of the lowest: "
                    + ", ".join(f"{f} {100 * stats[f][0]:.2f}% (se {100 * stats[f][1]:.2f}%, "
                                f"{nfree[f]} free)" for f in order))


def _own_prior(prior, spec) -> dict:
    """The priors on ``spec``'s own parameters."""
    return {k: v for k, v in (prior or {}).items() if k in spec.form.names}


def fit_auto(df, config):
    excluded: dict = {}
    cands = candidates(df, config.fix, config.tie, config.params_column, excluded)
    if not cands and _curve_table(df):
        return fit_auto_curves(df, config)
    if not cands:
        raise InputError("no law form fits these columns (need compute, or params and tokens, "
                         "or curves with step and lr)", field="form")
    rows = [{"form": k, "error": f"not considered: {v}"} for k, v in excluded.items()]
    fitted = {}
    for label, spec in cands:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = fit_one(df, spec, replace(config, bootstrap=0,
                                              prior=_own_prior(config.prior, spec)))
        except InputError as e:
            rows.append({"form": label, "error": str(e)})
            continue
        bt = r.diagnostics.get("backtest", {})
        rows.append({"form": label, "objective": r.diagnostics["objective"],
                     "n_free": spec.n_free,
                     "rollout_mean_abs_final": bt.get("rollout_mean_abs_final"),
                     "leave_largest_out_abs_final": (bt.get("leave_largest_out") or {})
                     .get("mean_abs_final")})
        fitted[label] = (spec, r)
    if not fitted:
        raise InputError("no candidate form could be fitted: "
                         + "; ".join(r["error"] for r in rows), field="form")
    scored = [r for r in rows if r.get("rollout_mean_abs_final") is not None]
    if scored:
        win = min(scored, key=lambda r: r["rollout_mean_abs_final"])["form"]
        why = ("lowest rollout error at held-out final points: "
               + ", ".join(f"{r['form']} {100 * r['rollout_mean_abs_final']:.2f}%"
                           for r in sorted(scored, key=lambda r: r["rollout_mean_abs_final"])))
        simpler = _simplest_within_one_se(scored, fitted, win) if config.one_se_form else None
        if simpler is not None:
            win, why = simpler
        unscored = [r["form"] for r in rows if r not in scored and "error" not in r]
        if unscored:
            why += f"; not backtestable (too few smaller runs): {', '.join(unscored)}"
    else:
        win = min((r for r in rows if "error" not in r), key=lambda r: r["n_free"])["form"]
        why = "no candidate could be backtested (too few runs); simplest form chosen"
    spec, r = fitted[win]
    if config.bootstrap > 0:
        r = _bootstrapped(df, r, replace(config, prior=_own_prior(config.prior, spec)))
    return r.with_diagnostics(auto={"chosen": win, "why": why, "candidates": rows})


def _bootstrapped(df, r, config):
    """``r`` refitted with ``config``'s bootstrap (no backtest), its backtest reused."""
    bt = r.diagnostics.get("backtest")
    out = fit_one(df, r.spec, replace(config, backtest=False))
    return out if bt is None else out.with_diagnostics(backtest=bt)


def _carried(result, into, keys) -> dict:
    """The records of ``keys`` that ``result`` has and ``into`` (its replacement) lacks."""
    return {k: result.diagnostics[k] for k in keys
            if k in result.diagnostics and k not in into.diagnostics}


# ----------------------------------------------------------------------------- scale weighting
# Runs far below the ladder's top can pull a law's local slope there (fit.estimate.scale_weights).
# The default also fits the chosen form with Gaussian weights in decades below the largest run,
# each bandwidth backtested by the same rollout, and keeps the widest whose mean |error| over the
# held-out finals is within one standard error of the lowest (equal weights the widest). A
# bandwidth is a candidate only where it changes the fit (a run below weight 0.9) and the runs
# at NEAR_WEIGHT or more hold the form alone: free parameters + NEAR_RUNS_MARGIN runs spanning
# NEAR_LEVELS values (0.05 decades) of every scale input. Porian et al.'s IsoFLOP grid takes 0.5
# decades (its 12th budget: +6.5% -> +1.3%); Gadre's and OLMo's see no gain (docs/LOG.md).
BANDWIDTHS = (2.0, 1.0, 0.5)
NEAR_RUNS_MARGIN = 2
NEAR_LEVELS = 3


def _bandwidth_candidate(data, logs, spec, params_column, h) -> str | None:
    """Why bandwidth ``h`` is not a candidate for this table and form, or None."""
    w = np.exp(-0.5 * ((logs.max() - logs) / h) ** 2)
    if w.min() >= 0.9:
        return f"every run within {h * np.sqrt(-2 * np.log(0.9)):.2g} decades of the largest: "\
               "the same fit as equal weights"
    near = set(logs.index[w >= NEAR_WEIGHT])
    need = spec.n_free + NEAR_RUNS_MARGIN
    if len(near) < need:
        return f"{len(near)} runs at weight {NEAR_WEIGHT:g} or more; the form needs {need}"
    last = data.loc[data.groupby("run")["fraction"].idxmax()]
    last = last[last["run"].isin(near)]
    for col in scale_inputs(spec.form, params_column):
        if col in last.columns and last[col].notna().all():
            v = last[col].to_numpy(dtype=float)
            if "fraction" in last.columns and col in ("tokens", "compute"):
                v = v / last["fraction"].to_numpy(dtype=float)
            k = np.unique(np.round(np.log10(v) * 20)).size
            if k < NEAR_LEVELS:
                return f"the runs at weight {NEAR_WEIGHT:g} or more span {k} value(s) of {col}"
    return None


def _label(h) -> str:
    return "equal weights" if h == math.inf else f"{h:g} decades"


def scale_weight_rule(df, result, config):
    """``result`` or the same form with the weights the rollout prefers (see above); the
    decision in ``diagnostics["scale_weighting"]`` (``bandwidth``: decades, None: equal)."""
    spec = result.spec
    data, _ = select_points(df, spec.form, None)
    logs, kind = run_scales(data)
    record = {"scale": kind, "method": "rollout backtest, one-standard-error rule, equal "
              "weights the widest", "candidates": {}, "bandwidth": None}
    cands = []
    for h in BANDWIDTHS:
        why = _bandwidth_candidate(data, logs, spec, config.params_column, h)
        if why:
            record["candidates"][_label(h)] = {"not a candidate": why}
        else:
            cands.append(h)
    if not cands:
        record.update(applied=False, chosen=_label(math.inf),
                      why="no bandwidth is a candidate for this ladder")
        return result.with_diagnostics(scale_weighting=record)
    pri = _own_prior(config.prior, spec)
    fits = {math.inf: result}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for h in cands:
            try:
                fits[h] = fit_one(df, spec, replace(config, bootstrap=0, bandwidth=h, prior=pri))
            except InputError as e:
                record["candidates"][_label(h)] = {"not fitted": str(e)}
    order = sorted(fits, reverse=True)              # equal weights (inf) first: the widest
    chosen, stats, n_common = one_se_choice({h: held_out_errors(r) for h, r in fits.items()},
                                            order)
    if chosen is None:
        record.update(applied=False, chosen=_label(math.inf),
                      why=f"{n_common} held-out run(s) common to the candidates' rollout "
                          "backtests: nothing to compare")
        return result.with_diagnostics(scale_weighting=record)
    for h, (m, se) in stats.items():
        record["candidates"][_label(h)] = {"mean_abs_err": m, "se": se, "held_out": n_common}
    why = (f"rollout mean |err| over {n_common} held-out finals: "
           + ", ".join(f"{_label(h)} {100 * stats[h][0]:.2f}% (se {100 * stats[h][1]:.2f}%)"
                       for h in order)
           + f"; the widest within one se of the lowest: {_label(chosen)}")
    record.update(applied=True, chosen=_label(chosen),
                  bandwidth=None if chosen == math.inf else chosen, why=why)
    r = fits[chosen]
    if chosen != math.inf and config.bootstrap > 0:
        r = _bootstrapped(df, r, replace(config, bandwidth=chosen, prior=pri))
    return r.with_diagnostics(**_carried(result, r, ("auto", "trajectory_vs_per_fraction")),
                              scale_weighting=record)


# ----------------------------------------------------------------------------- asymptote rule
# A short ladder (<= 5 sizes; the real one has 4) often cannot tell E from the slope, and a free
# E goes wherever the noise says (0.87 on the real MoE ladder). When E is flagged unidentified,
# the default also fits E with a prior and E fixed at its mean; defensible: within
# DEFENSIBLE_RATIO x the best rollout error (or DEFENSIBLE_ABS). The centre is the defensible
# variant of lowest error with a plausible E (fit.estimate.implausible_asymptote); the band pools
# every defensible variant's draws. The prior E ~ N(0.7, 0.1) x the smallest loss: published
# ladders put E at 55-90% of their losses (Hoffmann et al. 2022, Besiroglu et al. 2024, Marin).
SHORT_LADDER_LEVELS = 5
E_PRIOR_FRACTION = (0.7, 0.1)
DEFENSIBLE_RATIO = 3.0
DEFENSIBLE_ABS = 0.002


def _score(r, folds: set | None = None) -> float | None:
    """``r``'s rollout error (curve error for curve forms) over ``folds`` (None: all)."""
    bt = r.diagnostics.get("backtest") or {}
    use = [f for f in bt.get("folds") or [] if folds is None or _fold_key(f) in folds]
    if r.form in CURVES_FORMS:
        curve = [f["curve_mean_abs_rel_err"] for f in use
                 if f.get("curve_mean_abs_rel_err") is not None]
        if curve:
            return float(np.mean(curve))
    fin = [abs(x) for f in use for x in f.get("final_rel_err") or []]
    return float(np.mean(fin)) if fin else None


def _fold_key(fold: dict) -> tuple:
    return tuple(fold.get("held_out") or ())


def _narrow_backtest(r, folds: set):
    """``r`` with only the backtest folds in ``folds`` (its summaries recomputed), so the
    centre's band rests on the tests it was compared on; the others go under ``skipped``."""
    bt = r.diagnostics.get("backtest")
    if not bt or not bt.get("folds"):
        return r
    keep = [f for f in bt["folds"] if _fold_key(f) in folds]
    drop = [f for f in bt["folds"] if _fold_key(f) not in folds]
    if not drop:
        return r
    skipped = list(bt.get("skipped") or []) + [
        {"train_runs": f["train_runs"], "held_out": f["held_out"],
         "final_rel_err": f["final_rel_err"],
         "reason": "asymptote rule: a fold the other variants could not fit (fewer training "
                   "runs than their free parameters need); the variants are compared, and the "
                   "band's extrapolation term estimated, on the folds they share"}
        for f in drop]
    return r.with_diagnostics(backtest=summarise_folds(dict(bt, folds=keep, skipped=skipped)))


def _common_folds(variants: dict) -> set | None:
    """The backtest folds (by held-out runs) every backtested variant has, or None. A variant
    with fewer free parameters fits folds of fewer runs, which extrapolate further: scored on
    their own folds, variants are compared on different tests (docs/LOG.md 2026-12-02)."""
    sets = [{_fold_key(f) for f in (v.diagnostics.get("backtest") or {}).get("folds") or []}
            for v in variants.values()]
    sets = [x for x in sets if x]
    common = set.intersection(*sets) if sets else set()
    return common or None


def asymptote_rule(df, result, config):
    """``result`` or, when a short ladder leaves E unidentified, the variant the rule above
    chooses; the decision and why in ``diagnostics["asymptote_rule"]``."""
    form, fix, prior = result.spec.form, config.fix, config.prior
    if "E" not in form.names or "E" in fix or "E" in (prior or {}) or result.by:
        return result
    # a ladder's length is its number of model sizes (runs within 0.05 decades are one size);
    # without a size column, its scale levels (planned compute)
    if "params" in df.columns and df["params"].notna().all():
        size = df.groupby("run")["params"].max().astype(float)
        n_levels = int(np.unique(np.round(np.log10(size) * 20)).size)
    else:
        n_levels = int(scale_levels(df).nunique())
    unident = (result.diagnostics.get("identifiability") or {}).get("unidentified") or []
    record = {"short_ladder": n_levels <= SHORT_LADDER_LEVELS, "sizes": n_levels,
              "E_unidentified": "E" in unident}
    if n_levels > SHORT_LADDER_LEVELS or "E" not in unident:
        record["applied"] = False
        return result.with_diagnostics(asymptote_rule=record)
    lmin = float(df["loss"].min())
    mean, sd = E_PRIOR_FRACTION[0] * lmin, E_PRIOR_FRACTION[1] * lmin

    variants = {"free": result}
    fixed = Spec(form, fix=dict(result.spec.fix, E=mean), tie=dict(result.spec.tie))
    candidates = [(f"prior E~N({mean:.3g}, {sd:.3g})", result.spec,
                   dict(prior or {}, E=(mean, sd))), (f"fixed E={mean:.3g}", fixed, prior)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, spec, pri in candidates:
            try:
                variants[label] = fit_one(df, spec, replace(config, prior=pri))
            except InputError as e:
                record.setdefault("not_fitted", {})[label] = str(e)
    common = _common_folds(variants) if config.shared_folds else None
    scores = {k: _score(v, common) for k, v in variants.items()}
    scored = {k: v for k, v in scores.items() if v is not None}
    record.update(applied=True, prior={"mean": mean, "sd": sd}, rollout_error=scores,
                  rollout_folds=(sorted(list(k) for k in common) if common else
                                 "each variant's own (they share no fold)"))
    if not scored:
        record["chosen"] = "free"
        record["why"] = "no variant could be backtested; E stays free (and flagged)"
        return result.with_diagnostics(asymptote_rule=record)
    best = min(scored, key=scored.get)
    limit = max(DEFENSIBLE_RATIO * scored[best], scored[best] + DEFENSIBLE_ABS)
    defensible = [k for k, v in scored.items() if v <= limit]
    # never centred on an E the report calls implausible while a defensible plausible one
    # exists; the implausible ones stay in the pooled band. Not "the prior variant whenever
    # defensible": tried, docs/LOG.md ("the asymptote variants' centre").
    lmin_fit = {k: float(select_points(df, v.spec.form, None)[0]["loss"].min())
                for k, v in variants.items()}
    e_values = {k: float(v.params["E"]) for k, v in variants.items()}
    implausible = {k: implausible_asymptote(e_values[k], lmin_fit[k]) for k in variants}
    ok = [k for k in defensible if implausible[k] is None]
    centre = min(ok, key=scored.get) if ok else best
    chosen = variants[centre]
    if common:
        chosen = _narrow_backtest(chosen, common)
    draws = [variants[k].boot_u for k in defensible if variants[k].boot_u is not None]
    if len(draws) > 1:
        chosen = chosen.with_draws(np.vstack(draws))
    why = ("rollout errors " + ", ".join(f"{k} {100 * v:.2f}%" for k, v in scored.items())
           + f"; defensible (within {DEFENSIBLE_RATIO:g}x of the best): "
           + ", ".join(defensible))
    if centre == best:
        why += f"; centre: {best} (lowest"
        why += (", E plausible)" if implausible[best] is None else
                f"; no defensible variant has a plausible E, so the centre stays on it: "
                f"{implausible[best]})")
    else:
        why += (f"; centre: {centre} (the lowest error among the defensible variants with a "
                f"plausible E, {e_values[centre]:.4g}), not {best}: {implausible[best]}")
    why += "; the band pools the draws of the defensible variants"
    record.update(chosen=centre, lowest_rollout=best, defensible=defensible,
                  E=e_values, implausible={k: v for k, v in implausible.items() if v},
                  centre_plausible=implausible[centre] is None, why=why)
    return chosen.with_diagnostics(asymptote_rule=record,
                                   **_carried(result, chosen, ("auto", "scale_weighting")))


# ----------------------------------------------------------------------------- two laws at once


def fit_task(df: pd.DataFrame, via: str, metric: str, config: FitConfig | None = None, *,
             smooth: int = SMOOTH, skip: float = SKIP, where: str = "<table>",
             **changes) -> TaskLaw:
    """Downstream accuracy in two steps (fit.task) on a table of evals: step 1 the law
    ``config`` asks for (``changes``: its fields by name) of the task loss ``via``; step 2 the
    sigmoid from it to the accuracy ``metric``, with step 1's bootstrap, level and seed."""
    config = replace(config or FitConfig(), **changes, metric=via)
    t1, pairs = task.step1_table(df, via, metric, smooth=smooth, skip=skip, where=where)
    step1 = fit_law(load_points(t1, metric=via), config)
    return task.chain(step1, t1, pairs, metric, bootstrap=config.bootstrap, level=config.level,
                      seed=config.seed, smooth=smooth, skip=skip, where=where)


def compare_points(df_a: pd.DataFrame, df_b: pd.DataFrame, config: FitConfig | None = None, *,
                   at: float | None = None, at_source: str | None = None,
                   **changes) -> tuple[Comparison, tuple]:
    """Fit the law ``config`` asks for (default form compute, metric loss; ``changes``: its
    fields by name) to A's and B's tables (B's seed A's + 1) and compare them: (Comparison,
    (law A, law B))."""
    config = replace(config or FitConfig(form="compute", metric="loss"), **changes)
    form, metric, seed = config.form, config.metric or "loss", config.seed
    if form not in COMPARE_FORMS:
        raise InputError(f"one of {', '.join(COMPARE_FORMS)} (a law of compute alone, which "
                         f"can be inverted), got {form!r}", field="--form", exit_code=EX_USAGE)
    if at is not None and not (math.isfinite(at) and at > 0):
        raise InputError(f"must be a positive number of FLOPs, got {at!r}", field="--at",
                         exit_code=EX_USAGE)
    fits = []
    for side, df, s in (("A", df_a, seed), ("B", df_b, seed + 1)):
        try:
            fits.append(fit_law(df, replace(config, seed=s, metric=metric)))
        except InputError as e:
            msg = str(e)
            if e.field and not e.path:
                msg = msg.removeprefix(f"field '{e.field}': ")
            raise InputError(f"recipe {side}, metric {metric}: {msg}",
                             path=e.path or df.attrs.get("source"), field=e.field,
                             exit_code=e.exit_code) from None
    bootstrap, level = config.bootstrap, config.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cmp = compare_laws(fits[0], fits[1], df_a, df_b, metric=metric, at=at,
                           at_source=at_source, level=level, draws=max(bootstrap, MIN_PAIRS),
                           seed=seed)
    return cmp, tuple(fits)


# ----------------------------------------------------------------------------- law.json
# One reader keyed by form: fit.result.LawResult.from_json hands each file to the kind that reads
# its form (the imports above register the curve and task kinds).


def law_from_json(obj: dict, *, path=None, metric: str | None = None) -> LawResult:
    """A law.json object to its law (by ``form``), validated; ``metric`` picks one of a law/2
    file's laws (required there; fit.lawjson.select)."""
    inner, prefix = lawjson.select(obj, path=path, metric=metric)
    return _read_one(inner, prefix, path)


def _read_one(inner: dict, prefix: str, path) -> LawResult:
    """One law object read; its errors under ``prefix`` (``laws['KEY'].``, a law/2 file's)."""
    try:
        return LawResult.from_json(inner, path=path)
    except InputError as e:
        raise (lawjson.within(e, prefix, path) if prefix else e) from None


def laws_from_json(obj: dict, *, path=None) -> dict[str, LawResult]:
    """Every law of a law.json object, {metric key: law} in the file's order."""
    laws = lawjson.multi_laws(obj, path=path)
    if laws is None:
        law = LawResult.from_json(obj, path=path)
        return {law.metric: law}
    return {key: _read_one(law, f"laws[{key!r}].", path) for key, law in laws.items()}


def load_law(path, metric: str | None = None):
    """Read and validate a law.json file (:func:`law_from_json`)."""
    return law_from_json(read_json(path, schema="law"), path=path, metric=metric)


def load_laws(path) -> dict[str, LawResult]:
    """Every law of a law.json file, {metric key: law} (one for a single-metric file)."""
    return laws_from_json(read_json(path, schema="law"), path=path)
