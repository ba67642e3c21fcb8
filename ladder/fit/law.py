"""Fitting a law to a points table: ``fit_law(df, form=...)``, the package's entry point.

It checks the options, then hands the table to the form's fitter: a schedule-aware curve law
(fit.curve_fit), ``--form auto`` (fit.select: every candidate form, chosen by rollout backtest),
one form (fit.backtest.fit_one: fit.estimate's fit plus its backtests), or one law per value of
a column (``--by``); on a short ladder that leaves the asymptote unidentified, the asymptote
rule (fit.select). How a law is fitted is documented in fit.estimate; its band in fit.result.

Layers inside ladder/fit/, bottom to top (each imports only those below it): forms, identify,
config, solver, prediction, points, lr_schedules, curve_forms, allocation, report -> lawjson
-> result -> curve_law, task_law, estimate -> backtest -> curve_fit, select -> law (this module;
also the one law.json reader keyed by form: it imports task_law, whose class registers the task
form) -> task (downstream accuracy through a task loss: a law of this module chained into a
sigmoid).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

import ladder.fit.lawjson as lawjson
from ladder.fit.backtest import (
    EXTRAPOLATION_POWER,
    backtest,
    fit_one,
    with_power,
    trajectory_vs_per_fraction,
)
from ladder.fit.config import HUBER_DELTA, OBJECTIVES, FitConfig
from ladder.fit.curve_fit import fit_curve_law
from ladder.fit.curve_forms import FORMS as _CURVE_LAW_FORMS
from ladder.fit.estimate import fit_by, fit_spec, select_points
from ladder.fit.forms import FORMS, Spec, form_choices, get_form
from ladder.fit.points import COLUMNS, load_points
from ladder.fit.prediction import Prediction
from ladder.fit.result import FitResult, LawResult, extrapolation_rate
from ladder.fit.select import asymptote_rule as apply_asymptote_rule
from ladder.fit.select import fit_auto
from ladder.fit.select import scale_weight_rule as apply_scale_weight_rule
from ladder.fit.task_law import TaskLaw  # noqa: F401 - its class registers the form law.json reads
from ladder.io import InputError, read_json

CURVE_FORMS = tuple(_CURVE_LAW_FORMS)  # schedule-aware curve laws (fit.curve_forms): mpl, momentum
# The most points one fit takes (issue 26). Memory is bounded whatever the size (the objective
# is evaluated in slices, ladder.fit.estimate.CHUNK_VALUES), but time is not: `ladder fit` of 2,000
# points with the default form took 35 s of CPU here and grows with the points (a 300,000-point
# table: hours). A ladder needs far fewer (the real one: 4 rungs x 20 fractions); a table this
# large is a run's every logged step, which says no more about the law than every 1% of it.
MAX_FIT_ROWS = 100_000

__all__ = ["CURVE_FORMS", "HUBER_DELTA", "OBJECTIVES", "FitConfig", "FitResult", "LawResult",
           "Prediction", "extrapolation_rate", "fit_by", "fit_law", "fit_one", "fit_spec",
           "law_from_json", "laws_from_json", "load_law", "load_laws", "select_points"]


def fit_law(df, config: FitConfig | None = None, **changes) -> FitResult:
    """Fit the law ``config`` asks for (:class:`FitConfig`; default: ``FitConfig()``, with
    ``changes``, its fields by name: ``fit_law(df, form="compute", bootstrap=100)`` is
    ``fit_law(df, FitConfig(form="compute", bootstrap=100))``) to the points table ``df``
    (from :func:`fit.load_points`; files or a bare DataFrame are read through it).

    A named form (``form="chinchilla"``) gives that form's own estimator: Epoch's refit. The
    forecast-only devices (None: on for ``form="auto"``, the forecast default, off for a named
    form; True/False: as asked) move the estimates only in that forecast layer, and a law they
    moved keeps the form's own estimates and allocation beside them in
    ``diagnostics.forecast_layer`` (docs/scoreboard.md: on the public ladders the devices earn
    their place in the forecast, 0.174 -> 0.124 aggregate interval score).
    ``asymptote_rule``: on a short ladder that leaves E unidentified, choose among free, prior
    and fixed-E variants by rollout backtest (``ladder.fit.select.asymptote_rule``).
    ``scale_weighting``: also fit the chosen form with weights that fall off with a run's
    decades below the largest run, and keep them where the rollout backtest says they predict
    the largest runs better (``ladder.fit.select.scale_weight_rule``); the asymptote rule then fits
    its variants with the same weights.
    ``band_prior``: opt-in (None/False: the ladder's own band): the noise and extrapolation
    terms the ladder measures pooled with their values across the public ladders (True:
    ``BAND_PRIOR``; a dict: that prior; ladder.fit.result.band_prior_of). It moves no
    estimate; measured on bench/scoreboard.py it did not earn a place as a default.
    ``extrapolation_power``: the band's extrapolation term as s d^p outside the fitted runs
    (ladder.fit.backtest.EXTRAPOLATION_POWER; None: that p, 0, for ``form="auto"``, and the rate
    per decade, as before, for a named form; a number: that p). It moves no estimate."""
    config = _with(config, changes)
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
        res = apply_scale_weight_rule(df, res, config)
    if rules and (auto if config.asymptote_rule is None else config.asymptote_rule):
        bw = (res.diagnostics.get("scale_weighting") or {}).get("bandwidth")
        res = apply_asymptote_rule(df, res, replace(config, bandwidth=bw))
    if isinstance(res, FitResult):
        res = _forecast_layer(res, plain, config.band_prior)
        power = config.extrapolation_power
        if power is None and auto:
            power = EXTRAPOLATION_POWER
        if power is not None and "backtest" in res.diagnostics:
            res = res.with_diagnostics(backtest=with_power(res.diagnostics["backtest"], power))
    return _left_out(res, df)


def _with(config: FitConfig | None, changes: dict) -> FitConfig:
    """``config`` (default ``FitConfig()``) with ``changes``, which must name its fields."""
    unknown = sorted(set(changes) - set(FitConfig.__dataclass_fields__))
    if unknown:
        raise TypeError(f"fit_law() got unexpected keyword argument(s) {', '.join(unknown)}; "
                        f"FitConfig's fields: {', '.join(FitConfig.__dataclass_fields__)}")
    return replace(config or FitConfig(), **changes)


def _plain_loss(df) -> bool:
    """A DataFrame built by hand with a plain ``loss`` column (no ``metric`` column, no metric
    named in its attrs as load_points names one)."""
    return isinstance(df, pd.DataFrame) and "loss" in df.columns and \
        "metric" not in df.columns and not df.attrs.get("metric")


# The band's prior (ladder.fit.result.band_prior_of): medians over the 12 public ladders of
# bench/scoreboard.py of each ladder's own measured terms (its plain fit: form auto, no rule, no
# weights): the run-to-run noise as a log sd, the extrapolation error per decade. weight: the
# observations the prior is worth, 9: the fewest a 90% residual quantile can rank
# (m >= level / (1 - level), ladder.fit.result.FitResult.noise_half_width), fixed before scoring.
# The scoreboard learns these leave-one-ladder-out (no ladder is scored by a prior it informed).
BAND_PRIOR_WEIGHT = 9.0
BAND_PRIOR = {"noise_log_sd": 0.00628, "rate": 0.0401, "weight": BAND_PRIOR_WEIGHT, "source": "bench/scoreboard.py: medians over its 12 public ladders' plain fits"}  # noqa: E501


def _forecast_layer(res, plain, band_prior) -> FitResult:
    """``res`` with its forecast layer on record (``diagnostics.forecast_layer``): the band's
    prior, and where a device (scale weights, the asymptote rule) moved the estimates, the
    form's own estimates beside them, so law.json and the report say which numbers are which."""
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
    """The runs the points table's reader left out (a ladder's target: fit.points.load_points)
    go into the law's ``inputs.left_out``, so the law and its report say what it did not see."""
    left = list(df.attrs.get("left_out") or [])
    return replace(res, inputs={**res.inputs, "left_out": left}) if left else res


def _spec(form: str, fix: dict, tie: dict) -> Spec:
    if form in CURVE_FORMS:
        raise InputError(f"the {form} form is a schedule-aware curve law (ladder.fit.curve_fit)",
                         field="form")
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




# ----------------------------------------------------------------------------- law.json
# One reader keyed by form: law.json files of every form share the schema (law/3; law/1 files read
# through ladder.fit.lawjson.upgrade, one reader per version) and its envelope
# (fit.lawjson.to_json); a curve law's own fields are under "curve" (fit.curve_law.CurveLaw), a
# Chinchilla-family law's under "fit" (fit.lawjson.fit_own). fit.result.LawResult.from_json hands
# each file to the kind that reads its form (importing fit.curve_fit here registers the curve one).


def law_from_json(obj: dict, *, path=None, metric: str | None = None) -> LawResult:
    """A law.json object to its law (a FitResult or a CurveLaw, by ``form``), validated. A
    multi-metric file (law/2) holds one law per metric: ``metric`` picks one (required there); on
    a single-metric file it must be the law's own metric (fit.lawjson.select; refusals exit 64)."""
    inner, prefix = lawjson.select(obj, path=path, metric=metric)
    return _read_one(inner, prefix, path)


def _read_one(inner: dict, prefix: str, path) -> LawResult:
    """One law object read; its errors under ``prefix`` (``laws['KEY'].``, a law/2 file's)."""
    try:
        return LawResult.from_json(inner, path=path)
    except InputError as e:
        raise (lawjson.within(e, prefix, path) if prefix else e) from None


def laws_from_json(obj: dict, *, path=None) -> dict[str, LawResult]:
    """Every law of a law.json object, {metric key: law} in the file's order (a single-metric
    file: its one law under its metric)."""
    laws = lawjson.multi_laws(obj, path=path)
    if laws is None:
        law = LawResult.from_json(obj, path=path)
        return {law.metric: law}
    return {key: _read_one(law, f"laws[{key!r}].", path) for key, law in laws.items()}


def load_law(path, metric: str | None = None):
    """Read and validate a law.json file (any form); of a multi-metric file, the law of
    ``metric`` (:func:`law_from_json`)."""
    return law_from_json(read_json(path, schema="law"), path=path, metric=metric)


def load_laws(path) -> dict[str, LawResult]:
    """Every law of a law.json file, {metric key: law} (one for a single-metric file)."""
    return laws_from_json(read_json(path, schema="law"), path=path)
