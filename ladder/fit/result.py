"""The fitted law: ``LawResult`` (every kind's shared part) and ``FitResult`` (the
Chinchilla family; fit.curve_law.CurveLaw is the curve laws'), with its prediction band.

The band at a point, in log space, adds in quadrature: the parameter part (the bootstrap
quantile deviation, else z x the delta-method se), the run-to-run noise part
(``FitResult.noise_half_width``), the law's own extrapolation error outside its runs
(``FitResult.extrapolation_log_sd``) and an extra log-sigma (eval noise). A band that cannot be
computed is NaN with a warning. ``objective="ols"``: the OLS prediction interval of log(L - E).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.special import ndtri, stdtrit  # quantiles; scipy.stats takes 0.6 s to import

import ladder.fit.lawjson as lawjson
from ladder.fit.config import FitConfig
from ladder.fit.forms import FORMS, Model, Spec
from ladder.fit.prediction import Prediction, Query
from ladder.fit.report import fit_lines, parameter_rows, report, short_lines
from ladder.io import InputError, as_float

SMALL_SAMPLE = ("normal", "student-t")
_SCALES = ("params", "active_params", "tokens", "compute", "fraction")  # a Query's scale fields


class LawResult:
    """A fitted law of any form (the ``ladder.fit.prediction.Law`` protocol, implemented once):
    ``predict``, ``band``, the views, the law.json envelope (fit.lawjson.to_json) and
    ``from_json``, which hands an object to the kind that reads its ``form``. A kind adds its
    model (``_predict``), its own law.json fields and report lines, and names its forms when it
    subclasses: ``class CurveLaw(LawResult, forms=FORMS)``."""

    _KINDS: dict[str, type] = {}   # form -> the LawResult subclass that fits and reads it
    by = None   # the column of a one-law-per-value fit (ladder.fit.estimate.fit_by), else None

    def __init_subclass__(cls, forms=(), **kw):
        super().__init_subclass__(**kw)
        for f in forms:
            LawResult._KINDS[f] = cls

    # what a kind provides: form, expression, metric, level, params, intervals, diagnostics,
    # inputs, conventions, created, tool_version, band_method, predict(), _uncertainty_own(),
    # _json_own(), _report_lines(), from_json()

    @property
    def identifiability(self) -> dict:
        """{"flags": {name: [reasons]}, "unidentified": [names]}: what the data do not pin."""
        return self.diagnostics.get("identifiability") or {"flags": {}, "unidentified": []}

    def with_diagnostics(self, **entries) -> LawResult:
        """This law with ``entries`` added to a new diagnostics mapping (no law is changed)."""
        return replace(self, diagnostics={**self.diagnostics, **entries})

    def diagnostics_json(self) -> dict:
        """``diagnostics`` as law.json writes them."""
        return self.diagnostics

    def predict(self, query=None, /, *, level: float | None = None,
                extra_log_sigma=0.0, extrapolation: bool = True, **fields):
        """The law at ``query`` (a :class:`ladder.fit.prediction.Query` or its fields as keywords,
        which broadcast; a scalar question gets floats) with its band at ``level`` (None: the
        kind's default). A pandas DataFrame ``query`` (columns: the query's fields) gets a
        DataFrame on its index with ``loss``, ``lo`` and ``hi``. ``extra_log_sigma``: a log sd
        added to the band in quadrature; ``extrapolation``: the band holds the law's own
        extrapolation error outside its runs."""
        kw = {"level": level, "extra_log_sigma": extra_log_sigma, "extrapolation": extrapolation}
        frame = _as_frame(query)
        if frame is not None:
            return self._predict_frame(frame, kw, **fields)
        return _no_0d(self._predict(Query.of(query, **fields), **kw))

    def _predict_frame(self, frame, kw, **fields):
        import pandas as pd
        names = [f.name for f in dataclasses.fields(Query)]
        given = {c: frame[c].to_numpy() for c in frame.columns if c in names}
        if not given:
            raise InputError(f"the DataFrame has none of the query's columns ({', '.join(names)})"
                             f"; it has {', '.join(map(str, frame.columns)) or 'none'}",
                             field="query")
        p = self._predict(Query.of(None, **{**given, **fields}), **kw)
        n = len(frame)
        cols = {k: np.broadcast_to(np.asarray(getattr(p, k), dtype=float), (n,))
                for k in ("loss", "lo", "hi")}
        out = pd.DataFrame(cols, index=frame.index)
        out.attrs["level"] = p.level
        return out

    def parameter_table(self):
        """The parameters as a DataFrame (index: name): estimate, lo, hi, identified, note."""
        import pandas as pd
        return pd.DataFrame(parameter_rows(self)).set_index("name")

    def summary(self) -> str:
        """The law in a dozen lines (``report()`` has the whole fit)."""
        return "\n".join(short_lines(self))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>\n" + self.summary() + \
            "\n(.report(): the whole fit; .parameter_table(): the table as a DataFrame)"

    def _repr_html_(self) -> str:
        """A notebook's view: the form and data, then the parameter table."""
        import html
        head = short_lines(self)
        rows = "".join(
            f"<tr><td>{html.escape(x['name'])}</td><td>{x['estimate']:.6g}</td>"
            f"<td>{x['lo']:.4g}</td><td>{x['hi']:.4g}</td>"
            f"<td>{'yes' if x['identified'] else '<b>no</b>'}</td>"
            f"<td>{html.escape(x['note'])}</td></tr>" for x in parameter_rows(self))
        rest = [ln for ln in head[2:] if not ln.startswith(" ") and
                not ln.startswith("parameters")]
        return (f"<div><b>{html.escape(head[0])}</b><br>{html.escape(head[1])}"
                f"<table><thead><tr><th>parameter</th><th>estimate</th>"
                f"<th colspan=2>{self.level:.0%} interval</th><th>identified</th><th>note</th>"
                f"</tr></thead><tbody>{rows}</tbody></table>"
                + "".join(f"{html.escape(ln)}<br>" for ln in rest) + "</div>")

    def band(self, query: Query | None = None, /, **fields) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of :meth:`predict`'s band (same arguments)."""
        p = self.predict(query, **fields)
        return p.lo, p.hi

    def report(self) -> str:
        return report(self)

    def to_json(self) -> dict:
        return lawjson.to_json(self)

    @classmethod
    def from_json(cls, obj: dict, *, path=None) -> LawResult:
        """A one-law law.json object to the law its ``form`` names, validated."""
        form = obj.get("form") if isinstance(obj, dict) else None
        kind = LawResult._KINDS.get(form) if isinstance(form, str) else None
        if kind is None or kind is cls:
            lawjson.check_envelope(lawjson.upgrade(obj, path=path), path=path,
                                   forms=tuple(LawResult._KINDS))
            raise InputError(f"unknown form {form!r}", path=str(path) if path else "<law>",
                             field="form")
        return kind.from_json(obj, path=path)


@dataclass(frozen=True)
class Spread:
    """What a Chinchilla-family law's band is made of besides its estimate (law.json
    ``uncertainty``): bootstrap draws of ``u`` (``boot_u``, (R, P)), the delta-method covariance
    of the free coordinates (``cov``), the residual ``sigma`` and ``dof``, the sorted |log
    residuals| (``abs_resid``; None in old files) and ``small_sample``, the quantile used with
    few residuals ("student-t" in law/1 files)."""

    boot_u: np.ndarray | None = None
    cov: np.ndarray | None = None
    sigma: float | None = None
    dof: float | None = None
    abs_resid: np.ndarray | None = None
    small_sample: str = "normal"

    def __post_init__(self):
        if self.small_sample not in SMALL_SAMPLE:
            raise ValueError(f"small_sample: one of {SMALL_SAMPLE}, got {self.small_sample!r}")
        for name in ("boot_u", "cov"):
            v = getattr(self, name)
            object.__setattr__(self, name, None if v is None else np.asarray(v, dtype=float))
        if self.abs_resid is not None:
            object.__setattr__(self, "abs_resid", np.sort(np.abs(np.asarray(self.abs_resid,
                                                                            dtype=float))))


def _as_frame(query):
    """``query`` when it is a pandas DataFrame, else None (pandas is not imported for it)."""
    import sys
    pd = sys.modules.get("pandas")
    return query if pd is not None and isinstance(query, pd.DataFrame) else None


def _no_0d(p: Prediction) -> Prediction:
    """A prediction whose 0-d arrays (a scalar question) are floats."""
    def f(a):
        return float(a) if isinstance(a, np.ndarray) and a.ndim == 0 else a
    return replace(p, loss=f(p.loss), lo=f(p.lo), hi=f(p.hi))


@dataclass(frozen=True, eq=False, repr=False)
class FitResult(LawResult, forms=tuple(FORMS)):
    """A fitted law of the Chinchilla family, never changed after it is made: ``spec`` (the
    form with its fixed and tied parameters), ``u`` (the solver's parameter vector), ``config``
    (what it was fitted with; its backtest refits with it), ``spread``, ``intervals``,
    ``diagnostics``, ``inputs`` and the stamp. A ``by=`` fit holds one law per value in
    ``groups`` and predicts by interpolating log loss between them. ``starts``: its backtest
    refits' starts (not written to law.json)."""

    spec: Spec
    u: np.ndarray
    config: FitConfig = field(default_factory=FitConfig)
    spread: Spread = field(default_factory=Spread)
    intervals: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    by: str | None = None
    groups: tuple = ()            # ((value, FitResult), ...)
    starts: np.ndarray | None = None
    conventions: dict | None = None
    created: str | None = None
    tool_version: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "u", np.asarray(self.u, dtype=float))
        object.__setattr__(self, "groups", tuple(self.groups or ()))
        for k, v in stamp(self.created, self.conventions, self.tool_version).items():
            object.__setattr__(self, k, v)

    # --- what it was fitted with, and its spread ----------------------------------------------
    metric = property(lambda self: self.config.metric or "loss")
    level = property(lambda self: float(self.config.level))
    params_column = property(lambda self: self.config.params_column)
    objective = property(lambda self: self.config.objective)
    prior = property(lambda self: self.config.prior)   # name -> (mean, sd), natural units
    boot_u = property(lambda self: self.spread.boot_u)
    cov = property(lambda self: self.spread.cov)
    sigma = property(lambda self: self.spread.sigma)
    dof = property(lambda self: self.spread.dof)
    abs_resid = property(lambda self: self.spread.abs_resid)
    small_sample = property(lambda self: self.spread.small_sample)

    def with_draws(self, boot_u) -> FitResult:
        """This law with other bootstrap draws."""
        return replace(self, spread=replace(self.spread, boot_u=boot_u))

    # --- named views ---------------------------------------------------------------------------
    form = property(lambda self: self.spec.form.name)
    expression = property(lambda self: self.spec.form.expression)

    @property
    def params(self) -> dict:
        return {p.name: float(p.to_display(self.u[i])) for i, p in enumerate(self.spec.form.params)}

    # --- prediction ----------------------------------------------------------------------------
    def _predict(self, q: Query, *, level, extra_log_sigma, extrapolation) -> Prediction:
        """Loss and its band at ``level`` (default 0.9). ``compute`` and ``tokens`` are so far
        at the point; ``fraction`` is the progress through the planned run (default 1)."""
        level = 0.9 if level is None else float(level)
        if not 0 < level < 1:
            raise ValueError(f"level: must be in (0, 1), got {level!r}")
        if extrapolation:
            x = self.extrapolation_log_sd(q.params, q.tokens, q.compute, q.fraction,
                                          q.active_params)
            extra_log_sigma = np.sqrt(np.square(np.asarray(extra_log_sigma, float)) + x ** 2)
        if self.groups:
            return self._predict_groups(q, level, extra_log_sigma)
        cols = self._columns(q)
        shape = np.broadcast(*cols.values()).shape
        flat = {k: np.broadcast_to(v, shape).ravel() for k, v in cols.items()}
        fr = self.diagnostics.get("fraction_range")
        if "fraction" in cols and fr and as_float(fr[0]) is not None:
            # below the smallest fitted fraction the early-transient factor is held at its
            # value there (1/g would explode), with a warning
            flat["fraction_floor"] = float(as_float(fr[0]))
            if np.any(flat["fraction"] < flat["fraction_floor"] - 1e-9):
                warnings.warn(f"{self.form} law: fractions below {flat['fraction_floor']:g}, "
                              "the smallest fitted, are extrapolated", stacklevel=3)
        model = Model(self.spec.form, self.spec.form.features(flat))
        center = model.log_predict(self.u[None])[0]
        lo, hi = self._band(model, center, level, np.broadcast_to(extra_log_sigma, shape).ravel())
        return Prediction(loss=np.exp(center).reshape(shape), lo=lo.reshape(shape),
                          hi=hi.reshape(shape), level=level)

    def extrapolation_log_sd(self, params=None, tokens=None, compute=None, fraction=None,
                             active_params=None) -> np.ndarray:
        """The law's own extrapolation error (a log sd) at each point: the rollout backtest's
        measure (fit.backtest: a rate per decade, or s d^p) at the point's decades outside the
        fitted runs' range, the largest over the inputs given (tokens and compute planned, at
        fraction 1); 0 inside every range or without a backtest. Below the range the rate
        measured upward holds too (Gadre et al.'s bottom rung, 0.85 decades below the rest, is
        missed by 5-24%; docs/LOG.md, 2026-12-01)."""
        bt = self.diagnostics.get("backtest")
        given = [np.asarray(x, float) for x in (params, tokens, compute, fraction, active_params)
                 if x is not None]
        shape = np.broadcast(*given).shape if given else ()
        pooled = lawjson.pooled_record(bt)
        if pooled is None:  # no backtest, or none that measured a rate (law/1)
            return np.zeros(shape)
        fr = np.asarray(1.0 if fraction is None else fraction, float)
        with np.errstate(divide="ignore", invalid="ignore"):  # tokens and compute planned
            vals = {"params": params, "active_params": active_params, "tokens": tokens,
                    "compute": compute}
            vals = {k: np.asarray(v, float) / fr if k in ("tokens", "compute") else
                    np.asarray(v, float) for k, v in vals.items() if v is not None}
            if params is not None and tokens is not None:  # a law/1 per-fold record's scale
                vals["params_x_tokens"] = (np.asarray(params, float) * np.asarray(tokens, float)
                                           / fr)
        d = input_distance(vals, pooled["ranges"], shape)
        prior = band_prior_of(self.diagnostics)
        if prior is None and "power" in pooled:
            # the power model s d^p, outside the runs in the form's inputs or planned compute
            d = np.maximum(d, input_distance(vals, pooled["scale_ranges"], shape))
            if pooled["scale"] is None:
                return self._unmeasured(d, shape)
            x = np.where(d > 0, pooled["scale"] * np.power(np.maximum(d, 1e-300),
                                                           pooled["power"]), 0.0)
            if "along" in pooled and fraction is not None:
                # a point along a larger run's curve: the rollout's error along held-out
                # curves at its fraction (fit.backtest.along_curve); 0 at the end
                gs, sds = pooled["along"]
                g = np.broadcast_to(fr, shape)
                a = np.where(g < 1 - 1e-9, np.interp(g, gs, sds), 0.0)
                x = np.where(d > 0, np.maximum(x, a), x)
            return x
        if prior is not None:  # the forecast layer's prior on the rate (band_prior_of)
            n = ((bt or {}).get("extrapolation") or {}).get("n_points") or 0
            return shrink(pooled["rate"], float(n), prior["rate"], prior["weight"]) * d
        if pooled["rate"] is None:
            return self._unmeasured(d, shape)
        return pooled["rate"] * d

    def _unmeasured(self, d, shape) -> np.ndarray:
        # no rollout fold measured the error outside the runs: said, not hidden
        if np.any(d > 0):
            warnings.warn(f"{self.form} law: points up to {float(np.max(d)):.2f} "
                          "decades outside the fitted runs' range, and no rollout "
                          "fold measured the extrapolation error: the band holds "
                          "none", stacklevel=5)
        return np.zeros(shape)

    def _columns(self, q: Query) -> dict:
        given = {k: getattr(q, k) for k in _SCALES}
        form = self.spec.form
        if form.curves and q.fraction is None:
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
        z = float(ndtri(q))
        tq = None if not (dof and dof > 0) else (z if self.small_sample == "normal"
                                                 else float(stdtrit(dof, q)))
        reasons, up = [], None   # up, down: the parameter part
        if self.boot_u is not None and len(self.boot_u) >= 20:
            dev = model.log_predict(self.boot_u) - center[None]     # (R, m)
            up = np.maximum(np.quantile(dev, q, axis=0), 0.0)
            down = np.maximum(-np.quantile(dev, 1 - q, axis=0), 0.0)
        elif self.cov is not None and tq is not None:
            # the delta method only without the bootstrap (both would double the spread), at
            # the normal quantile: t of the 1-2 dof of a 4-5 rung ladder is 3-6 (+-25% at 6.9B)
            J = model.jacobian(self.u) @ self.spec.mapping()[1]     # (m, F)
            up = down = tq * np.sqrt(np.maximum(np.einsum("mf,fg,mg->m", J, self.cov, J), 0.0))
        if up is None:
            reasons.append("no parameter uncertainty (no bootstrap replicates and no "
                           "covariance)")
        noise = self.noise_half_width(level)
        if noise is None:
            reasons.append("no residual degrees of freedom to estimate run-to-run noise "
                           f"(dof={dof})")
        if reasons:
            warnings.warn(f"{self.form} law: prediction band unavailable: "
                          + "; ".join(reasons), stacklevel=4)
            nan = np.full_like(center, np.nan)
            return nan, nan
        extra = z * np.asarray(extra, dtype=float)
        hi = center + np.sqrt(up ** 2 + noise ** 2 + extra ** 2)
        lo = center - np.sqrt(down ** 2 + noise ** 2 + extra ** 2)
        return np.exp(lo), np.exp(hi)

    def noise_method(self, level: float = 0.9) -> str:
        """Which estimate the band's noise part uses at ``level`` (see noise_half_width)."""
        if self.objective == "ols":
            return "ols"
        if self._noise_rank_level(level) is not None:
            return "residual quantile"
        return "normal x sigma" if self.small_sample == "normal" else "student-t x sigma"

    def _noise_rank_level(self, level):
        a, dof = self.abs_resid, self.dof
        if a is None or not a.size or not dof or dof <= 0:
            return None
        m = dof + self.spec.n_free                 # effective number of observations
        qq = level * (m + 1) / m                   # split-conformal rank ceil((m+1) level)/m
        return qq if qq <= 1 else None

    def noise_half_width(self, level: float) -> float | None:
        """Half-width (log loss) of the band's run-to-run noise part at ``level``: the |log
        residuals|' quantile at the split-conformal rank (level x (m + 1) / m, m = dof + free
        parameters), scaled by sqrt(m / dof). Distribution-free because ladder residuals are not
        Gaussian (Gadre et al.'s M=5 runs miss by 4-15%, the rest by 1-2%, and t(dof) x their
        RMS set a +-6% band everywhere). Too few observations for the rank (m < level / (1 -
        level)): the normal quantile x sigma (t(dof) x sigma in law/1 files: with 1 dof, t is
        6.3)."""
        own = self._own_noise_half_width(level)
        prior = band_prior_of(self.diagnostics)
        if prior is None:
            return own
        # the forecast layer's prior: the ladder's own estimate, worth its dof, pooled with it
        z = float(ndtri(0.5 + level / 2))
        return shrink(own, max(float(self.dof or 0), 0.0), z * prior["noise_log_sd"],
                      prior["weight"])

    def _own_noise_half_width(self, level: float) -> float | None:
        qq = self._noise_rank_level(level)
        if qq is not None:
            m = self.dof + self.spec.n_free
            return float(np.quantile(self.abs_resid, qq)) * math.sqrt(m / self.dof)
        if self.sigma is None or not self.dof or self.dof <= 0:
            return None
        q = 0.5 + level / 2
        quant = float(ndtri(q)) if self.small_sample == "normal" else float(stdtrit(self.dof, q))
        return quant * self.sigma

    def band_terms(self, level: float = 0.9) -> dict:
        """The band's two ladder-measured terms before any prior, with the numbers behind them:
        the noise log sd (dof) and the extrapolation rate per decade (held-out points)."""
        own = self._own_noise_half_width(level)
        ex = ((self.diagnostics.get("backtest") or {}).get("extrapolation") or {})
        return {"noise_log_sd": None if own is None else own / float(ndtri(0.5 + level / 2)),
                "dof": float(self.dof or 0),
                "rate": ex.get("rate_per_decade"), "rate_points": int(ex.get("n_points") or 0)}

    def _band_ols(self, model, center, level, extra):
        """The OLS prediction interval of log(L - E) (statsmodels' ``obs_ci``: t(dof) x
        sqrt(x' V x + sigma^2)) mapped to loss, the extra log-sigma added in quadrature."""
        q = 0.5 + level / 2
        if not (self.dof and self.dof > 0 and self.cov is not None and self.sigma is not None):
            warnings.warn(f"{self.form} law (ols): prediction band unavailable: no residual "
                          f"degrees of freedom (dof={self.dof})", stacklevel=4)
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

    def _predict_groups(self, q: Query, level, extra):
        values = np.array([v for v, _ in self.groups])
        g = np.asarray(1.0 if q.fraction is None else q.fraction, dtype=float)
        given = {k: getattr(q, k) for k in _SCALES[:4]}
        shape = np.broadcast(*[np.asarray(x) for x in (*given.values(), g, extra)
                               if x is not None]).shape
        gb = np.broadcast_to(g, shape).ravel()
        tol = 1e-6 + 0.5e-3  # group values are fractions rounded to 1e-3
        if np.any(gb < values.min() - tol) or np.any(gb > values.max() + tol):
            raise InputError(f"outside the fitted range {values.min():g}..{values.max():g} of "
                             f"the per-{self.by} laws", field=self.by)
        out = np.full((3, gb.size), np.nan)
        def b(x):
            return None if x is None else np.broadcast_to(np.asarray(x, float), shape).ravel()
        kw = {**{k: b(v) for k, v in given.items()}, "level": level, "extra_log_sigma": b(extra),
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

    # --- JSON ----------------------------------------------------------------------------------
    def _uncertainty_own(self) -> dict:
        return lawjson.fit_uncertainty(self)

    def _json_own(self) -> dict:
        return lawjson.fit_own(self)

    def _report_lines(self) -> list[str]:
        return fit_lines(self)

    @classmethod
    def from_json(cls, obj: dict, *, path=None) -> FitResult:
        """A law.json object (law/3 or law/1, a Chinchilla-family form) to a FitResult."""
        top, groups = lawjson.read(obj, path=path)

        def build(kw):
            return cls(**dict(kw, spread=Spread(**kw["spread"])))
        return build(dict(top, groups=tuple((v, build(kw)) for v, kw in groups)))

    @property
    def band_method(self) -> str:
        """The band's method, by name (law.json ``uncertainty.band_method``)."""
        return lawjson.band_method(self)


def input_distance(values: dict, ranges: dict, shape=()) -> np.ndarray:
    """Decades outside ``ranges`` ({column: [log10 lo, hi]}) of points with ``values``
    ({column: planned value}): the largest over the columns given, 0 inside every range."""
    d = np.zeros(shape)
    for c, (lo, hi) in ranges.items():
        v = values.get(c)
        if v is None:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            lv = np.log10(np.broadcast_to(np.asarray(v, dtype=float), shape))
        out = np.maximum(lv - hi, 0.0) + np.maximum(lo - lv, 0.0)
        d = np.maximum(d, np.where(np.isfinite(out), out, 0.0))
    return d


def band_prior_of(diagnostics) -> dict | None:
    """The forecast layer's prior on the band's two measured terms (``diagnostics.band_prior``,
    fit.law.BAND_PRIOR): ``noise_log_sd``, ``rate`` (per decade) and ``weight`` (observations it
    is worth); None without a valid one. A ladder's own terms rest on few numbers (1 residual
    dof, 2-4 held-out finals) and alone set +-6 to +-20% bands where the law missed by 0.3%
    (Gadre et al.'s RedPajama ladder, docs/scoreboard.md)."""
    bp = (diagnostics or {}).get("band_prior")
    if not isinstance(bp, dict):
        return None
    try:
        out = {k: float(bp[k]) for k in ("noise_log_sd", "rate", "weight")}
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and v >= 0 for v in out.values()):
        return None
    return out


def shrink(own: float | None, n: float, prior: float, n0: float) -> float:
    """sqrt((n own^2 + n0 prior^2) / (n + n0)): ``own`` (from ``n`` numbers) pooled with
    ``prior`` (worth ``n0``), the posterior mean of a variance under a scaled-inverse-chi-square
    prior (Gelman et al., BDA 3rd ed., 3.3); ``prior`` where nothing was measured."""
    if own is None or not math.isfinite(own) or n <= 0:
        return float(prior)
    return math.sqrt((n * own * own + n0 * prior * prior) / (n + n0))


def extrapolation_rate(bt) -> tuple:
    """(rate per decade, scale kind, log10 of the smallest and largest run's scale) from a
    backtest's record; None for what it does not hold."""
    bt = bt if isinstance(bt, dict) else {}
    rec = lawjson.pooled_record(bt)
    top, bottom = bt.get("scale_log10_max"), bt.get("scale_log10_min")
    return (None if rec is None else rec["rate"], bt.get("scale"),
            float(bottom) if isinstance(bottom, (int, float)) else None,
            float(top) if isinstance(top, (int, float)) else None)


def stamp(created=None, conventions=None, tool_version=None) -> dict:
    """A law's stamp: ``created`` (now, UTC), FLOP ``conventions``, ``tool_version``; ours
    unless given."""
    from ladder import __version__
    from ladder.counting import conventions as ours
    return {"created": created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "conventions": conventions or ours(), "tool_version": tool_version or __version__}
