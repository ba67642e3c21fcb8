"""Loading the artifacts a report is drawn from (run directories, the law, the pre-registration,
the alerts) into :class:`ReportInputs`; nothing is refitted. Any artifact may be absent: what is
missing or unusable is one line of ``ReportInputs.notes``, which the report prints. A path the
user named that does not exist, or a file that is not what it claims to be, is an
:class:`InputError`.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ladder.fit.prediction import Prediction
from ladder.io import EX_NOINPUT, InputError, as_float, iter_jsonl, read_json, sha256_of
from ladder.predict.prereg_view import ForecastBand, band_level, forecast_band, target_of
from ladder.sources.runs import RunDir, find_run_dirs, read_run

DEFAULT_METRIC = "eval_dropless/loss"  # the metric the real ladder fitted (DESIGN.md §1)
DEFAULT_LEVEL = 0.9


# ----------------------------------------------------------------------------- runs


@dataclass
class Series:
    """One metric of one run: aligned arrays, rows without a finite value dropped."""

    step: np.ndarray
    fraction: np.ndarray
    tokens: np.ndarray
    value: np.ndarray

    def __len__(self) -> int:
        return len(self.value)


@dataclass
class RunData(RunDir):
    """One run directory as :mod:`sources.runs` reads it, with the report's views of its
    metrics."""

    def keys(self) -> set[str]:
        out: set[str] = set()
        for r in self.rows:
            out.update(r)
        return out

    def series(self, key: str) -> Series:
        """``key`` over the run (cached)."""
        cache = self.__dict__.setdefault("_series_cache", {})
        if key not in cache:
            cache[key] = self._series(key)
        return cache[key]

    def _series(self, key: str) -> Series:
        out = []
        steps, planned = self.steps, self.planned_tokens
        for r in self.rows:
            v = as_float(r.get(key))
            if v is None or not math.isfinite(v):
                continue
            s, g, t = (as_float(r.get(k)) for k in ("step", "progress", "tokens"))
            if g is None and s is not None and steps:
                g = s / steps
            if t is None and g is not None and planned:
                t = g * planned
            if g is None and t is not None and planned:
                g = t / planned
            out.append((s, g, t, v))  # None: NaN
        return Series(*np.array(out, float).reshape(-1, 4).T.copy())

    def nonfinite_steps(self, key: str) -> list[float]:
        """Steps where ``key`` was logged as NaN/Inf (a diverging run says so this way)."""
        out = []
        for r in self.rows:
            v = as_float(r.get(key))
            if v is not None and not math.isfinite(v):
                out.append(as_float(r.get("step")) or float("nan"))
        return out

    def final(self, metric: str) -> float | None:
        """The final value of ``metric`` of a complete run (its last eval at the end of the plan,
        else ``summary.final``); None for a run that has not finished."""
        if self.status != "complete":
            return None
        s = self.series(metric)
        if len(s) and np.isfinite(s.fraction[-1]) and s.fraction[-1] >= 0.999:
            return float(s.value[-1])
        fin = self.summary.get("final")
        if isinstance(fin, dict):
            v = as_float(fin.get(metric))
            if v is not None and math.isfinite(v):
                return v
        return float(s.value[-1]) if len(s) else None


def load_run(path: str | os.PathLike) -> RunData:
    run = read_run(path)
    return RunData(**{f.name: getattr(run, f.name) for f in fields(RunDir)})


# ----------------------------------------------------------------------------- the law


@dataclass
class LawView:
    """The law's JSON (always) and its Python object (when ``fit.load_law`` can rebuild it)."""

    meta: dict
    obj: Any = None
    path: Path | None = None
    error: str | None = None  # why predictions are unavailable

    @property
    def form(self) -> str:
        return str(getattr(self.obj, "form", None) or self.meta.get("form") or "?")

    @property
    def metric(self) -> str:
        return str(getattr(self.obj, "metric", None) or self.meta.get("metric") or DEFAULT_METRIC)

    @property
    def params(self) -> dict:
        p = getattr(self.obj, "params", None)
        if not isinstance(p, dict):
            p = self.meta.get("params")
        return p if isinstance(p, dict) else {}

    @property
    def level(self) -> float:
        u = self.meta.get("uncertainty")
        v = as_float(u.get("level")) if isinstance(u, dict) else None
        return v if v and 0 < v < 1 else DEFAULT_LEVEL

    def predict(self, level: float | None = None, **kw) -> Prediction | None:
        """``law.predict`` of the query's fields ``kw`` (ladder.fit.prediction.Query) as arrays;
        None (and ``error`` set) when it cannot be evaluated."""
        if self.obj is None:
            return None
        schedule = kw.pop("schedule", None)
        kw = {k: np.asarray(v, dtype=float) for k, v in kw.items() if v is not None}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a NaN band is reported by the plots, not stderr
                p = self.obj.predict(level=level or self.level, **kw,
                                     **({} if schedule is None else {"schedule": schedule}))
            shape = np.broadcast(*kw.values()).shape if kw else ()
            return Prediction(*(np.broadcast_to(np.asarray(getattr(p, a), float), shape).copy()
                                for a in ("loss", "lo", "hi")),
                              level=float(getattr(p, "level", level or self.level)))
        except Exception as e:  # noqa: BLE001 -- any failure of the law is shown, not raised
            self.error = f"law.predict failed: {type(e).__name__}: {e}"
            return None

    @property
    def is_curve(self) -> bool:
        """A loss-curve law of the LR schedule (``--form mpl``/``momentum``), evaluated from a
        run's schedule."""
        from ladder.fit.law import CURVE_FORMS  # the fitter's list, not a copy

        return self.form in CURVE_FORMS


def load_law(law: Any) -> LawView | None:
    """A law path (law.json) or an already-loaded law object (anything with ``predict``)."""
    if law is None:
        return None
    if not isinstance(law, (str, os.PathLike)):
        meta = law.to_json() if hasattr(law, "to_json") else {}
        return LawView(meta=meta if isinstance(meta, dict) else {}, obj=law)
    path = Path(law)
    meta = read_json(path, schema="law")
    view = LawView(meta=meta, path=path)
    try:  # imported here: a report without a law loads no scipy
        from ladder.fit import load_law as fit_load_law
        view.obj = fit_load_law(path)
    except Exception as e:  # noqa: BLE001 - the law is shown from its JSON, the failure noted
        view.error = f"fit.load_law({path.name}) failed: {type(e).__name__}: {e}"
    return view


# ----------------------------------------------------------------------------- prereg, alerts


def law_differs(law: LawView, prereg: dict, where=None) -> str | None:
    """A note when the law drawn is not the one the pre-registration embeds (issue 26); None
    when it is."""
    registered = prereg.get("law_sha256")
    shas = {sha256_of(law.meta)}
    if law.obj is not None and hasattr(law.obj, "to_json"):
        try:
            shas.add(sha256_of(law.obj.to_json()))
        except Exception:  # noqa: BLE001 - the note is about the file; its JSON is compared
            pass
    if registered in shas:
        return None
    name = law.path.name if law.path is not None else "the law given"
    return (f"the law drawn ({name}, sha256 {sha256_of(law.meta)[:12]}...) is not the one the "
            f"pre-registration {Path(str(where)).name if where else ''} embeds (law_sha256 "
            f"{str(registered)[:12]}...): its curve is not what the band was registered from")


# ----------------------------------------------------------------------------- all inputs


@dataclass
class ReportInputs:
    rungs: list[RunData]          # the ladder, sorted by planned compute (target excluded)
    target: RunData | None
    law: LawView | None
    prereg: dict | None
    alerts: list[dict] | None
    notes: list[str]              # what is missing or could not be used, one line each
    # the law's fitted points (--points FILE, else law.json's `points`): drawn on the law plot
    # when no runs directory is given (a law fitted from a CSV)
    points: Any = None            # pandas DataFrame of points-table columns, or None

    @property
    def metric(self) -> str:
        if self.law is not None:
            return self.law.metric
        if self.prereg and isinstance(self.prereg.get("metric"), str):
            return self.prereg["metric"]
        return DEFAULT_METRIC

    @property
    def level(self) -> float:
        v = band_level(self.prereg) if self.prereg else None
        if v is not None:
            return v
        return self.law.level if self.law is not None else DEFAULT_LEVEL

    @property
    def forecast(self) -> ForecastBand | None:
        """The registered forecast, as the watcher reads it (:mod:`ladder.predict.prereg_view`)."""
        return forecast_band(self.prereg) if self.prereg else None

    @property
    def target_info(self) -> dict:
        return target_of(self.prereg) if self.prereg else {}

    @property
    def target_name(self) -> str | None:
        name = self.target_info.get("name")
        if isinstance(name, str):
            return name
        return self.target.name if self.target is not None else None

    # computed once, shared by the page, the figures, the tables and the live page

    @cached_property
    def verdict(self) -> dict:
        """The target's last eval against the registered band (:func:`watch_verdict`)."""
        return watch_verdict(self)

    @cached_property
    def panels(self) -> list[Panel]:
        """One panel per registered metric, largest |residual| first (:func:`metric_panels`)."""
        return metric_panels(self)


def _same_run(run: RunData, name: str) -> bool:
    """A run matches a target name given as RUNG, LADDER:RUNG or LADDER/RUNG."""
    ladder = str(run.summary.get("ladder") or (run.rung.ladder if run.rung is not None else ""))
    names = {run.name, run.path.name}
    return name in names or name in {f"{ladder}:{n}" for n in names} | \
        {f"{ladder}/{n}" for n in names}


def law_points(law_view: LawView | None, points=None):
    """The points a law was fitted to: the points table ``points``, else law.json's ``points``
    block (``{columns, rows}``), else None. A malformed block is an InputError."""
    import pandas as pd
    if points is not None:
        from ladder.fit.points import load_points
        metric = law_view.metric if law_view is not None else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dropped rows: the fit said so when it ran
            df = load_points([points], metric)
        df.attrs["from"] = f"--points {Path(points).name}"
        return df
    block = law_view.meta.get("points") if law_view is not None else None
    if block is None:
        return None
    where = str(law_view.path) if law_view.path is not None else "<law>"
    cols = block.get("columns") if isinstance(block, dict) else None
    rows = block.get("rows") if isinstance(block, dict) else None
    if not (isinstance(cols, list) and all(isinstance(c, str) for c in cols)
            and isinstance(rows, list) and all(isinstance(r, list) and len(r) == len(cols)
                                               for r in rows)):
        raise InputError("expected {columns: [names], rows: [[values]]}", path=where,
                         field="points")
    df = pd.DataFrame(rows, columns=cols)
    for c in df.columns:
        if c != "run":
            df[c] = pd.to_numeric(df[c], errors="coerce")
    df.attrs["from"] = "law.json"
    return df


def load_inputs(runs=None, law=None, prereg=None, alerts=None, target_run=None,
                points=None) -> ReportInputs:
    notes: list[str] = []
    all_runs: list[RunData] = []
    if runs is not None:
        root = Path(runs)
        if not root.is_dir():
            raise InputError("no such runs directory", path=root, exit_code=EX_NOINPUT)
        dirs = find_run_dirs(root)
        if not dirs:
            notes.append(f"no run directories under {root}")
        all_runs = [load_run(d) for d in dirs]
    else:
        notes.append("no runs directory given (--runs): no ladder curves or health")

    law_view = load_law(law)
    if law_view is None:
        notes.append("no law given (--law): no fitted curve, no law plot")
    elif law_view.error:
        notes.append(law_view.error)

    prereg_obj = None
    if prereg is not None:
        if isinstance(prereg, (str, os.PathLike)):
            from ladder.predict.prereg import verify_doc  # a tampered forecast is never drawn
            prereg_obj = read_json(prereg, schema="prereg", field="--prereg")
            v = verify_doc(prereg_obj, str(prereg))
            if not v.ok:
                raise InputError("fails verification (edited after it was written): "
                                 + v.report().replace("\n", "; "), path=prereg,
                                 field="sha256")
        else:
            prereg_obj = dict(prereg)
    else:
        notes.append("no pre-registration given (--prereg): no forecast band, no watch plot")

    if law_view is not None and prereg_obj and isinstance(prereg_obj.get("law_sha256"), str) \
            and (note := law_differs(law_view, prereg_obj, prereg)):
        notes.append(note)

    alert_rows = None
    if alerts is not None:
        if isinstance(alerts, (str, os.PathLike)):
            if Path(alerts).exists() or Path(alerts).is_symlink():
                # tolerant: a partial last line and corrupt lines are skipped; a FIFO or a
                # device is refused, one line
                alert_rows = [row for _, row in iter_jsonl(alerts)]
            else:  # the watcher may write the file only when something fires
                alert_rows = []
                notes.append(f"alerts file {alerts} does not exist: read as no alerts")
        else:
            alert_rows = [dict(a) for a in alerts]
    else:
        notes.append("no alerts given (--alerts)")

    # The target: --target-run, else the run named like the pre-registration's target, else the
    # one run whose rung spec says is_target.
    target = None
    tname = target_of(prereg_obj).get("name") if prereg_obj else None
    if target_run is not None:
        target = load_run(target_run)
        tpath = target.path.resolve()
        all_runs = [r for r in all_runs if r.path.resolve() != tpath]
    else:
        named = [r for r in all_runs if tname and _same_run(r, str(tname))]
        flagged = [r for r in all_runs if r.is_target]
        target = (named or (flagged if len(flagged) == 1 else [None]))[0]
    all_runs = [r for r in all_runs if r is not target and not r.is_target]
    if target is None and (prereg_obj is not None or alerts is not None):
        notes.append(f"no target run found (looked for {tname!r} in --runs; or pass --target-run)")

    rungs = sorted(all_runs, key=lambda r: (r.compute if r.compute is not None else math.inf,
                                            r.name))
    return ReportInputs(rungs=rungs, target=target, law=law_view, prereg=prereg_obj,
                        alerts=alert_rows, notes=notes, points=law_points(law_view, points))


# ----------------------------------------------------------------------------- alert timing


def alert_fraction(a: dict, inp: ReportInputs) -> float | None:
    g = a.get("fraction")
    if isinstance(g, (int, float)) and math.isfinite(g):
        return float(g)
    ti = inp.target_info
    for key, total in (("step", ti.get("steps")), ("tokens", ti.get("tokens"))):
        v = a.get(key)
        if isinstance(v, (int, float)) and isinstance(total, (int, float)) and total > 0:
            return float(v) / float(total)
    return None


def not_applicable_spans(inp: ReportInputs) -> list[tuple[float, float]]:
    """Where the forecast did not apply: from the first alert of the watcher's applicability
    rule to the run's end (the watcher stops comparing then: nothing ends a span)."""
    from ladder.predict.watch import rule

    kinds = rule("applicability").kinds
    starts = [g for a in inp.alerts or []
              if str(a.get("kind", "")) in kinds and (g := alert_fraction(a, inp)) is not None]
    return [(min(starts), 1.0)] if starts else []


# ----------------------------------------------------------------------------- the verdict


def watch_verdict(inp: ReportInputs) -> dict:
    """Numbers the watch plot and the summary share: last actual vs forecast, inside or not."""
    out: dict = {}
    t, fc = inp.target, inp.forecast
    if t is None or fc is None:
        return out
    s = t.series(inp.metric)
    if not len(s):
        return out
    g, v = float(s.fraction[-1]), float(s.value[-1])
    f, lo, hi = (float(x) for x in fc.at(g))
    out.update(fraction=g, actual=v, forecast=f, lo=lo, hi=hi, complete=t.status == "complete")
    spans = [sp for sp in not_applicable_spans(inp) if sp[0] <= g <= sp[1] + 1e-9]
    if spans:  # the watcher declared the forecast void here: it is not judged (DESIGN.md §3)
        out["not_applicable_since"] = spans[-1][0]
        out["not_applicable_reason"] = next(
            (str(a.get("message", "")) for a in inp.alerts or []
             if a.get("kind") == "not_applicable"), "")
    elif math.isfinite(lo) and math.isfinite(hi):
        out["inside"] = lo <= v <= hi
    elif math.isfinite(f):
        out["band_missing"] = True
    return out


# ----------------------------------------------------------------------------- metric panels
# A multi-metric pre-registration's panels (issue 23 item 3, drawn by reports.metrics), sorted by
# the target's residual y / forecast - 1, the median of its last LAST_EVALS evals (robust to one
# noisy eval); a metric without evals last.

LAST_EVALS = 5


@dataclass
class Panel:
    metric: str
    band: ForecastBand | None
    series: Series | None
    alerts: list[dict]
    residual: float            # relative, median of the last evals; NaN when none

    @property
    def worst(self) -> str | None:
        sev = [a.get("severity") for a in self.alerts if a.get("severity") in ("warn", "critical")]
        return "critical" if "critical" in sev else "warn" if sev else None


def _residual(series: Series | None, band: ForecastBand | None) -> float:
    if series is None or band is None or not len(series):
        return math.nan
    ok = np.isfinite(series.fraction) & (series.fraction >= band.fraction[0]) & \
        (series.fraction <= band.fraction[-1])
    if not ok.any():
        return math.nan
    e = np.interp(series.fraction[ok], band.fraction, band.loss)
    r = series.value[ok] / e - 1
    return float(np.median(r[-LAST_EVALS:]))


def metric_panels(inp: ReportInputs) -> list[Panel]:
    """One :class:`Panel` per registered metric, largest |residual| first ([] unless the
    pre-registration is a multi-metric one); read as ``inp.panels``."""
    from ladder.predict.watch.multi import is_multi, metric_doc
    doc = inp.prereg
    if not is_multi(doc):
        return []
    out = []
    for key in doc.get("metrics") or []:
        band = forecast_band(metric_doc(doc, key))
        s = inp.target.series(key) if inp.target is not None else None
        mine = [a for a in inp.alerts or [] if a.get("metric") == key]
        out.append(Panel(key, band, s if s is not None and len(s) else None, mine,
                         _residual(s, band)))
    # stable: equal residuals keep the registered order
    return sorted(out, key=lambda p: -abs(p.residual) if math.isfinite(p.residual) else math.inf)
