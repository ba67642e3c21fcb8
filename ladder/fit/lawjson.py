"""law.json: write and validate-on-read (``law/3``, one law; ``law/2``, {metric key: one-law
document} under ``laws``; ``law/1``, one law written before law/3, still read).

Fields (shared/DESIGN.md): schema, form, expression, params, uncertainty, metric, conventions,
inputs, diagnostics, created, tool_version; ``fit`` holds what rebuilds the law exactly (spec,
params column, the solver's vector ``u``), ``uncertainty`` the bootstrap draws of ``u``, the
covariance, residual scale and dof, so bands can be recomputed at any level; a ``by`` fit has
``groups``, one such law per value. One reader per version (:func:`upgrade`): :func:`_v1` writes
out what a law/1 document's absent fields meant.
"""

from __future__ import annotations

import math

import numpy as np

from ladder.fit.config import FitConfig
from ladder.fit.forms import FORMS, U_LIMIT, Spec, get_form
from ladder.fit.points import listed_keys
from ladder.io import EX_USAGE, InputError, as_float, number, require, to_jsonable

SCHEMA = "law/3"        # one law (written)
MULTI_SCHEMA = "law/2"  # {metric key: one-law document} under "laws"
V1 = "law/1"            # one law, written before law/3 (read through _v1)
PER_FOLD = "per-fold RMS of log error per decade on one scale (law/1)"
# The band's spreads in log loss: 10 is a factor e^10 ~ 22,000 at one sd (a fit writes
# hundredths); beyond it exp(q x spread) soon overflows: an Infinity band (issue 39). The
# backtest's rate per decade and scale are held at it by their writer (fit.backtest.hold)
LOG_SPREAD_LIMIT = 10.0
# The extrapolation term's power p in s d^p (learned in [0, 1]; d^p overflows for large p)
POWER_LIMIT = 8.0
# Residual dof below 0.1: t(0.1) at 95% is 1.6e9, and stdtrit is not monotone below ~0.01
DOF_MIN = 0.1


def to_json(r) -> dict:
    """The law.json document of any fitted law: the shared envelope, then the kind's own
    fields (``r._json_own()``, ``r._uncertainty_own()``)."""
    obj = {
        "schema": SCHEMA,
        "form": r.form,
        "expression": r.expression,
        "params": r.params,
        "uncertainty": {"level": r.level, "intervals": r.intervals,
                        "band_method": r.band_method, **r._uncertainty_own()},
        "metric": r.metric,
        "conventions": r.conventions,
        "inputs": r.inputs,
        "diagnostics": r.diagnostics_json(),
        "created": r.created,
        "tool_version": r.tool_version,
    }
    obj.update(r._json_own())
    return to_jsonable(obj)


def multi_to_json(docs: dict[str, dict]) -> dict:
    """The law/2 document of several metrics' law.json documents ({key: law/1 object})."""
    if not docs:
        raise ValueError("laws: no law to write")
    first = next(iter(docs.values()))
    return {"schema": MULTI_SCHEMA, "laws": dict(docs), "created": first.get("created"),
            "tool_version": first.get("tool_version")}


def multi_laws(obj, *, path=None) -> dict[str, dict] | None:
    """A law/2 document's {metric key: one-law object}, its envelope checked; None for any other."""
    if not isinstance(obj, dict) or obj.get("schema") != MULTI_SCHEMA:
        return None
    where = str(path) if path else "<law>"
    laws = obj.get("laws")
    if not isinstance(laws, dict) or not laws:
        raise InputError("missing" if laws is None else "expected an object of {metric key: "
                         "law}, not empty", path=where, field="laws")
    for key, law in laws.items():
        if not isinstance(law, dict):
            raise InputError("expected a law object", path=where, field=f"laws[{key!r}]")
        if law.get("schema") not in (SCHEMA, V1):
            raise InputError(f"expected schema {SCHEMA!r} (or {V1!r}), got "
                             f"{law.get('schema')!r}", path=where, field=f"laws[{key!r}].schema")
        if law.get("metric") != key:
            raise InputError(f"the law of {key!r} names metric {law.get('metric')!r}",
                             path=where, field=f"laws[{key!r}].metric")
    return laws


def select(obj, *, path=None, metric: str | None = None) -> tuple[dict, str]:
    """The one-law object of ``metric`` and the prefix of its errors (``laws['KEY'].``, or "").
    A law/2 file needs ``metric``, a one-law file's must be its own (else exit 64)."""
    laws = multi_laws(obj, path=path)
    where = str(path) if path else "<law>"
    if laws is None:
        own = obj.get("metric") if isinstance(obj, dict) else None
        if metric is not None and own != metric:
            raise InputError(f"holds the law of one metric, {own!r}, not {metric!r}",
                             path=where, field="metric", exit_code=EX_USAGE)
        return obj, ""
    if metric is None:
        raise InputError(f"holds the laws of {len(laws)} metrics ({listed_keys(laws)}); choose "
                         "one with --metric KEY", path=where, field="metric",
                         exit_code=EX_USAGE)
    if metric not in laws:
        raise InputError(f"no law of metric {metric!r}; it holds {listed_keys(laws)}",
                         path=where, field="metric", exit_code=EX_USAGE)
    return laws[metric], f"laws[{metric!r}]."


def within(e: InputError, prefix: str, path=None) -> InputError:
    """``e`` (reading one law of a law/2 file) with its field under ``prefix``."""
    where = str(path) if path else "<law>"
    head = (e.path or where) + (f": field '{e.field}'" if e.field else "") + ": "
    msg = str(e)[len(head):] if str(e).startswith(head) else str(e)
    return InputError(msg, path=where, field=(prefix + (e.field or "")).rstrip("."),
                      exit_code=e.exit_code)


def check_envelope(obj, *, path=None, forms) -> str:
    """Validate what every law.json shares (a law/1 object of one of ``forms``); its form."""
    where = str(path) if path else "<law>"
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object", path=where, field="schema")
    def string(key):
        v = obj.get(key)
        if not isinstance(v, str):
            raise InputError("missing" if v is None else "expected a string", path=where,
                             field=key)
        return v
    schema = string("schema")
    if not schema.startswith("law/"):
        raise InputError(f"expected schema 'law/<version>', got {schema!r}", path=where,
                         field="schema")
    if schema != SCHEMA:
        raise InputError(f"unsupported version {schema!r} (this tool reads {SCHEMA} and {V1}"
                         + (f", and {MULTI_SCHEMA} files of several metrics through "
                            "ladder.fit.law.load_law / load_laws" if schema == MULTI_SCHEMA else "")
                         + ")", path=where, field="schema")
    form = string("form")
    if form not in forms:
        raise InputError(f"unknown form {form!r}", path=where, field="form")
    check_extrapolation(obj, path=path)
    return form


def fit_own(r) -> dict:
    """A Chinchilla-family law's own law.json fields."""
    obj = {"expression": r.expression + (f"  (one law per {r.by})" if r.by else ""),
           "fit": _fit_block(r)}
    if r.by:
        obj["by"] = r.by
        obj["groups"] = [{"value": v, "params": g.params, "fit": _fit_block(g),
                          "uncertainty": fit_uncertainty(g)} for v, g in r.groups]
    return obj


def _fit_block(r) -> dict:
    return {"spec": r.spec.to_json(), "params_column": r.params_column,
            "u_names": list(r.spec.form.names), "u": r.u.tolist(),
            "free": list(r.spec.free), "objective": r.objective,
            "prior": {k: [m, sd] for k, (m, sd) in r.prior.items()}}


def fit_uncertainty(r) -> dict:
    """A Chinchilla-family law's own ``uncertainty`` fields."""
    ols = r.objective == "ols"
    common = {
        "method": "ols: Student-t prediction interval of log(L - E), n - 2 dof (the OLS obs_ci "
                  "of statsmodels)" if ols else
                  "run-level Bayesian bootstrap (percentiles) and lack-of-fit residual quantile "
                  "(split-conformal rank; Student-t x sigma_log with too few points)",
        "level": r.level,
        "intervals": r.intervals,
        "bootstrap_u": None if r.boot_u is None or ols else r.boot_u.tolist(),
        "covariance_free": None if r.cov is None else r.cov.tolist(),
        "sigma_log": r.sigma,
        "dof": r.dof,
        "abs_residuals_log": None if r.abs_resid is None or ols else r.abs_resid.tolist(),
    }
    if ols:
        return {**common, "small_sample": r.small_sample,
                "band": "E + exp(log(L - E) +- t(dof) sqrt(x' V x + sigma^2)), V the covariance "
                        "of (log A, alpha); sigma the residual sd of log(L - E); the "
                        "extrapolation error (ladder.fit.result.FitResult.extrapolation_log_sd) in "
                        "quadrature", "band_method": band_method(r)}
    return {**common, "noise_method": r.noise_method(r.level), "small_sample": r.small_sample,
            "band_method": band_method(r), "band": _band_text(r)}


def _band_text(r) -> str:
    q = "normal quantile" if r.small_sample == "normal" else "t(dof)"
    ex = ((r.diagnostics or {}).get("backtest") or {}).get("extrapolation")
    power = ex.get("power") if isinstance(ex, dict) else None
    extra = ("the extrapolation error outside the runs (s d^p, p = "
             f"{power:g}: s the rollout folds' held-out log error, diagnostics.backtest."
             "extrapolation.log_sd_scale, d the decades outside ranges_log10 or "
             "scale_ranges_log10; along a run's curve at least along_curve's held-out error at "
             "its fraction)"
             ) if isinstance(power, (int, float)) else (
             "the extrapolation error outside the runs' range (the rollout folds' held-out log "
             "errors beyond their fold bands, pooled per decade: diagnostics.backtest."
             "extrapolation.rate_per_decade, x the largest distance in decades outside "
             "ranges_log10 over its inputs)") if _pooled(r) else (
             "the extrapolation error outside the runs' scale range (RMS of the rollout folds' "
             "log error per decade x decades outside; ladder.fit.result.extrapolation_rate)")
    return (f"log space: the bootstrap quantile for the parameters ({q} * delta-method se "
            "without usable replicates); for run-to-run noise the level x (m+1)/m quantile of "
            f"abs_residuals_log x sqrt(m/dof), m = dof + free parameters ({q} * sigma_log "
            f"where that rank exceeds 1, or without abs_residuals_log); {extra}; combined in "
            "quadrature")


def band_method(r) -> str:
    """The band's method by name: what ``FitResult.predict`` combines at ``r.level``."""
    if r.objective == "ols":
        return "ols-student-t + extrapolation"
    param = "bootstrap" if r.boot_u is not None and len(r.boot_u) >= 20 else "delta-method-t"
    noise = {"residual quantile": "residual-quantile", "normal x sigma": "normal-sigma"}.get(
        r.noise_method(r.level), "student-t-sigma")
    if getattr(r, "small_sample", "student-t") == "normal" and param == "delta-method-t":
        param = "delta-method-normal"
    # the pooled extrapolation rate (ladder.fit.backtest) or, in law/1 files from before it, the
    # per-fold one (or none)
    extra = "pooled-extrapolation" if _pooled(r) else "extrapolation"
    return f"{param} + {noise} + {extra}"


def _pooled(r) -> bool:
    ex = ((r.diagnostics or {}).get("backtest") or {}).get("extrapolation")
    return isinstance(ex, dict) and ex.get("method") != PER_FOLD


def read(obj: dict, *, path=None) -> tuple[dict, list]:
    """Validate a Chinchilla-family law object: (FitResult's keyword arguments, its ``spread``
    as Spread's; [(value, keyword arguments)] of its ``by`` groups)."""
    where = str(path) if path else "<law>"
    obj = upgrade(obj, path=path)
    form = check_envelope(obj, path=path, forms=tuple(FORMS))
    metric = require(obj, "metric", str, path=where)
    top = _read_block(obj, require(obj, "uncertainty", dict, path=where), "", form, metric, where)
    groups = []
    if obj.get("by"):
        for i, g in enumerate(require(obj, "groups", list, path=where)):
            pre = f"groups[{i}]."
            g = g if isinstance(g, dict) else {}  # not an object: its fields are missing
            value = require(g, "value", (int, float), path=where, prefix=pre)
            kw = _read_block(g, require(g, "uncertainty", dict, path=where, prefix=pre), pre,
                             form, metric, where)
            groups.append((float(value), kw))
    top.update(diagnostics=obj.get("diagnostics") or {}, inputs=obj.get("inputs") or {},
               conventions=obj.get("conventions"), created=obj.get("created"),
               tool_version=obj.get("tool_version"), by=obj.get("by"))
    return top, groups


def _mapping(d: dict, key: str, where: str, prefix: str) -> dict:
    """``d[key]`` as an object ({} when absent or null), or a one-line refusal naming it."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError("expected an object or null", path=where, field=prefix + key)
    return v


def _read_block(block: dict, unc: dict, prefix: str, form: str, metric: str,
                where: str) -> dict:
    """One law (the top level or one ``by`` group): its FitResult keyword arguments."""
    fit = require(block, "fit", dict, path=where, prefix=prefix)
    spec_d = require(fit, "spec", dict, path=where, prefix=prefix + "fit.")
    try:
        spec = Spec(get_form(form), fix={k: float(v) for k, v in
                                         _mapping(spec_d, "fix", where, prefix + "fit.spec.")
                                         .items()},
                    tie=dict(_mapping(spec_d, "tie", where, prefix + "fit.spec.")))
    except (ValueError, TypeError) as e:
        raise InputError(str(e), path=where, field=prefix + "fit.spec") from None
    u = _array(require(fit, "u", list, path=where, prefix=prefix + "fit."),
               (len(spec.form.names),), where, prefix + "fit.u")
    # beyond |700| exp() leaves float64: the fitter never writes that, an edit does
    if np.any(np.abs(u) > U_LIMIT):
        raise InputError(f"a parameter beyond |{U_LIMIT:g}|: exp() overflows float64",
                         path=where, field=prefix + "fit.u")
    spread = _read_spread(unc, spec, where, prefix)  # the fields checked in the order written
    level = number(unc.get("level", 0.9), field=prefix + "uncertainty.level", path=where,
                   lo=0, hi=1, lo_open=True, hi_open=True)
    objective, prior, column = _read_fit_options(fit, where, prefix)
    try:
        config = FitConfig(metric=metric, level=level, objective=objective, prior=prior,
                           params_column=column, bootstrap=0, backtest=False)
    except InputError as e:  # a prior with sd <= 0, or on a fixed parameter
        raise InputError(str(e).removeprefix("field 'prior': "), path=where,
                         field=prefix + "fit.prior") from None
    return {"spec": spec, "u": u, "config": config, "spread": spread,
            "intervals": _intervals(unc.get("intervals"), where, prefix)}


def _read_spread(unc: dict, spec: Spec, where: str, prefix: str) -> dict:
    """A law's ``uncertainty`` block: the keyword arguments of ``ladder.fit.result.Spread``."""
    def field(name):
        return prefix + "uncertainty." + name

    def bad(name, msg):
        return InputError(msg, path=where, field=field(name))

    def array(name, shape):  # null: None
        return None if unc.get(name) is None else _array(unc[name], shape, where, field(name))
    boot = array("bootstrap_u", (None, len(spec.form.names)))
    if boot is not None and np.any(np.abs(boot) > U_LIMIT):  # as fit.u: exp() overflows
        raise bad("bootstrap_u", f"a draw beyond |{U_LIMIT:g}|: exp() overflows float64")
    cov = array("covariance_free", (spec.n_free, spec.n_free))
    if cov is not None and np.any(np.diag(cov) < 0):
        # a huge variance is the fitter's word for a flat direction: read as written
        raise bad("covariance_free", "expected variances >= 0 on the diagonal")
    sigma, dof = unc.get("sigma_log"), unc.get("dof")
    for name, v in (("sigma_log", sigma), ("dof", dof)):
        if v is not None and not _finite(v):
            raise bad(name, "expected a finite number or null")
        if v is not None and v < 0:  # a negative sd gives a nonsense (inverted) band
            raise bad(name, f"must be >= 0, got {v!r}")
    if dof is not None and dof < DOF_MIN:
        # the fitter writes null where no residual dof is left (fit.estimate); t(0) is undefined
        raise bad("dof", f"must be >= {DOF_MIN:g} (null where there are none), got {dof!r}")
    if sigma is not None and sigma > LOG_SPREAD_LIMIT:
        raise bad("sigma_log", f"must be <= {LOG_SPREAD_LIMIT:g} (a log-loss sd), got {sigma!r}")
    small = unc.get("small_sample")
    if small not in ("normal", "student-t"):
        raise bad("small_sample", f"expected 'normal' or 'student-t', got {small!r}")
    if "abs_residuals_log" not in unc:
        raise bad("abs_residuals_log", "missing (null where there are none)")
    ares = array("abs_residuals_log", (None,))
    if ares is not None and (np.any(ares < 0) or np.any(ares > LOG_SPREAD_LIMIT)):
        raise bad("abs_residuals_log", f"expected |log residuals| in [0, {LOG_SPREAD_LIMIT:g}]")
    return {"boot_u": boot, "cov": cov, "sigma": sigma, "dof": dof, "abs_resid": ares,
            "small_sample": small}


def _read_fit_options(fit: dict, where: str, prefix: str) -> tuple[str, dict, str]:
    """The fit's objective, its priors ({name: (mean, sd)}) and its params column."""
    objective = fit.get("objective", "huber")
    if objective not in ("huber", "ols"):
        raise InputError(f"unknown objective {objective!r}", path=where,
                         field=prefix + "fit.objective")
    prior = {}
    for k, v in _mapping(fit, "prior", where, prefix + "fit.").items():
        if not (isinstance(v, list) and len(v) == 2 and all(as_float(x) is not None
                                                            for x in v)):
            raise InputError("expected [mean, sd]", path=where,
                             field=f"{prefix}fit.prior.{k}")
        prior[k] = (as_float(v[0]), as_float(v[1]))
    column = fit.get("params_column", "params")
    if column not in ("params", "active_params"):
        raise InputError(f"expected 'params' or 'active_params', got {column!r}",
                         path=where, field=prefix + "fit.params_column")
    return objective, prior, column


def upgrade(obj, *, path=None):
    """A one-law document of any version in law/3's shape (``_READERS``); anything else as it
    is, for the envelope check to refuse."""
    schema = obj.get("schema") if isinstance(obj, dict) else None
    reader = _READERS.get(schema) if isinstance(schema, str) else None
    return obj if reader is None else reader(obj, str(path) if path else "<law>")


def _v1(obj: dict, where: str = "<law>") -> dict:
    """A law/1 document in law/3's shape: only what is absent is filled in (a new document)."""
    out = dict(obj, schema=SCHEMA)
    form = obj.get("form")
    if not isinstance(form, str) or form not in FORMS:  # a curve or task law: law/3's shape
        return out                                     # (a bad form: the envelope refuses it)

    def unc(block):
        u = block.get("uncertainty") if isinstance(block, dict) else None
        if not isinstance(u, dict):
            return block
        u = dict(u)
        u.setdefault("small_sample", "student-t")
        u.setdefault("abs_residuals_log", None)
        return dict(block, uncertainty=u)
    out = unc(out)
    if isinstance(out.get("groups"), list):
        out["groups"] = [unc(g) for g in out["groups"]]
    diag = out.get("diagnostics")
    bt = diag.get("backtest") if isinstance(diag, dict) else None
    if isinstance(bt, dict) and pooled_record(bt) is None:
        bt = {k: v for k, v in bt.items() if k != "extrapolation"}
        rec = per_fold_extrapolation(bt, where)
        if rec is not None:
            bt["extrapolation"] = rec
        out["diagnostics"] = dict(diag, backtest=bt)
    return out


_READERS = {V1: _v1, SCHEMA: lambda obj, where: obj}


def per_fold_extrapolation(bt: dict, where: str = "<law>") -> dict | None:
    """A law/1 backtest's extrapolation record, in the pooled record's shape: the RMS over its
    folds of log error per decade of one scale, outside the runs' range of it (a null end
    unbounded); None without a fold that extrapolated."""
    per_decade = []
    field = "diagnostics.backtest.folds"
    folds = bt.get("folds")
    if folds is not None and not isinstance(folds, list):
        raise InputError("expected a list of folds", path=where, field=field)
    for i, fold in enumerate(folds or []):
        if not isinstance(fold, dict):
            raise InputError("expected a fold object", path=where, field=f"{field}[{i}]")
        d = fold.get("decades")
        if not (isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d)
                and d > 0):
            continue
        errs = fold.get("final_rel_err")
        if errs is not None and not isinstance(errs, list):
            raise InputError("expected a list of numbers", path=where,
                             field=f"{field}[{i}].final_rel_err")
        per_decade += [math.log1p(float(e)) / d for e in errs or []
                       if isinstance(e, (int, float)) and not isinstance(e, bool)
                       and math.isfinite(e) and e > -1]
    top, bottom, kind = bt.get("scale_log10_max"), bt.get("scale_log10_min"), bt.get("scale")
    if not per_decade or not _finite(top) or kind not in ("compute", "params_x_tokens",
                                                            "params"):
        return None
    bottom = float(bottom) if _finite(bottom) else None
    if bottom is not None and bottom > top:
        bottom = None
    return {"method": PER_FOLD, "inputs": [kind], "ranges_log10": {kind: [bottom, float(top)]},
            "rate_per_decade": float(np.sqrt(np.mean(np.square(per_decade))))}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_extrapolation(obj: dict, *, path=None) -> None:
    """A law's ``diagnostics.backtest.extrapolation`` record checked field by field: a malformed
    one is refused, never read as "no term" (a band 8x too narrow, issue 39)."""
    where = str(path) if path else "<law>"
    ex, f = obj, ""
    for key, what in (("diagnostics", "an object"), ("backtest", "an object or null"),
                      ("extrapolation", "an object or null")):
        f = f"{f}.{key}" if f else key
        ex = ex.get(key)
        if ex is None:
            return
        if not isinstance(ex, dict):
            raise InputError(f"expected {what}", path=where, field=f)

    def scalar(key, hi, unit=""):
        v = ex.get(key)
        if v is not None and not (_finite(v) and 0 <= v <= hi):
            raise InputError(f"expected null or a number in [0, {hi:g}]{unit}, got "
                             f"{str(v)[:40]!r}", path=where, field=f"{f}.{key}")
    scalar("rate_per_decade", LOG_SPREAD_LIMIT, " (log loss per decade)")
    ranges = ex.get("ranges_log10")
    if not isinstance(ranges, dict):
        raise InputError("expected an object {input: [log10 lo or null, log10 hi]}",
                         path=where, field=f + ".ranges_log10")
    for c, r in ranges.items():
        fc = f"{f}.ranges_log10.{c}"
        if not (isinstance(r, list) and len(r) == 2 and _finite(r[1])
                and (r[0] is None or _finite(r[0]))):
            raise InputError("expected [log10 lo or null, log10 hi], finite numbers",
                             path=where, field=fc)
        if r[0] is not None and r[0] > r[1]:
            raise InputError(f"lo {r[0]} above hi {r[1]}", path=where, field=fc)
        if abs(r[1]) > 400 or (r[0] is not None and abs(r[0]) > 400):
            raise InputError("beyond float64's range (|log10| > 400)", path=where, field=fc)
    scalar("power", POWER_LIMIT)
    scalar("log_sd_scale", LOG_SPREAD_LIMIT, " (log loss)")


def pooled_record(bt) -> dict | None:
    """A backtest's extrapolation record as {"rate", "ranges": {input: (log10 lo, hi)}} (and the
    power model's "power", "scale", "scale_ranges", "along"), or None without a valid one."""
    ex = bt.get("extrapolation") if isinstance(bt, dict) else None
    if not isinstance(ex, dict) or not isinstance(ex.get("ranges_log10"), dict):
        return None
    rate = ex.get("rate_per_decade")
    if rate is not None and not (isinstance(rate, (int, float)) and math.isfinite(rate)
                                 and rate >= 0):
        return None
    ranges = {}
    for c, r in ex["ranges_log10"].items():
        if not (isinstance(r, list) and len(r) == 2 and all(
                x is None or isinstance(x, (int, float)) and math.isfinite(x) for x in r)
                and r[1] is not None):
            return None
        ranges[str(c)] = (-math.inf if r[0] is None else float(r[0]), float(r[1]))
    out = {"rate": None if rate is None else float(rate), "ranges": ranges}
    # the power model (records written before it keep the rate per decade)
    power, sd = ex.get("power"), ex.get("log_sd_scale")
    if isinstance(power, (int, float)) and math.isfinite(power) and power >= 0 and (
            sd is None or isinstance(sd, (int, float)) and math.isfinite(sd) and sd >= 0):
        scale = ex.get("scale_ranges_log10") if isinstance(ex.get("scale_ranges_log10"),
                                                           dict) else {}
        out["power"] = float(power)
        out["scale"] = None if sd is None else float(sd)
        al = ex.get("along_curve") if isinstance(ex.get("along_curve"), dict) else {}
        fr, sd = al.get("fraction"), al.get("log_sd")
        if isinstance(fr, list) and isinstance(sd, list) and len(fr) == len(sd) and fr and all(
                isinstance(x, (int, float)) and math.isfinite(x) for x in fr + sd):
            out["along"] = (np.asarray(fr, float), np.asarray(sd, float))
        out["scale_ranges"] = {str(c): (float(r[0]), float(r[1])) for c, r in scale.items()
                               if isinstance(r, list) and len(r) == 2 and all(
                                   isinstance(x, (int, float)) and math.isfinite(x) for x in r)}
    return out


def _intervals(obj, where, prefix) -> dict:
    """name -> [lo, hi] as floats ("NaN" strings to NaN)."""
    out = {}
    if obj is not None and not isinstance(obj, dict):
        raise InputError("expected an object {name: [lo, hi]} or null", path=where,
                         field=prefix + "uncertainty.intervals")
    for name, iv in (obj or {}).items():
        if not isinstance(iv, list) or len(iv) != 2 or any(as_float(x) is None for x in iv):
            raise InputError("expected [lo, hi]", path=where,
                             field=f"{prefix}uncertainty.intervals.{name}")
        out[name] = [as_float(iv[0]), as_float(iv[1])]
    return out


def _array(v, shape, where, field):
    if _has_bool(v):  # numpy reads true/false as 1/0: a law's numbers are never booleans
        raise InputError("expected numbers, got a boolean", path=where, field=field)
    try:
        a = np.array(v, dtype=float)
    except (TypeError, ValueError):
        raise InputError("expected numbers", path=where, field=field) from None
    if a.ndim != len(shape) or any(s is not None and s != d
                                   for s, d in zip(shape, a.shape, strict=True)):
        raise InputError(f"expected shape {shape}, got {a.shape}", path=where, field=field)
    if not np.all(np.isfinite(a)):
        raise InputError("non-finite values", path=where, field=field)
    return a


def _has_bool(v) -> bool:
    if isinstance(v, bool):
        return True
    return isinstance(v, list) and any(_has_bool(x) for x in v)
