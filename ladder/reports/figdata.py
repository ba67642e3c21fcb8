"""What the report's figures draw, computed from the loaded artifacts (:class:`ReportInputs`): the
law along the ladder's runs and at the end of a run, the registered forecast and the target's
deviation from it, the alerts placed on the run. Plain data; :mod:`ladder.reports.plots` draws it.
The law is evaluated here and nowhere else in ``reports`` (``LawView.predict``); nothing is
refitted."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ladder.fit.forms import CURVES_FORMS
from ladder.io import as_float
from ladder.predict.planned import rung_query
from ladder.predict.watch import SEVERITIES, alert_kinds
from ladder.reports.inputs import ReportInputs, RunData, Series, alert_fraction
from ladder.reports.inputs import not_applicable_spans

# alerts about the watched metric (predict.watch.RULES, panel "watch"): lines on the watch plot;
# spikes and health alerts are ticks on its top edge
LOSS_ALERT_KINDS = alert_kinds("watch")
# loss alerts whose value is circled on the watch plot
MARKED_KINDS = ("above_band", "below_band", "trend", "rising")
# the run's train loss as the trainer logs it (trainer/step.py; the watcher's spike rule reads
# it): drawn faint beside the watched metric on the watch plot
TRAIN_KEY = "train/loss"


def is_loss_alert(a: dict) -> bool:
    """About the watched metric, by the alert's ``kind`` (a "cleared" alert's: the kind it
    ``clears``)."""
    kind = str(a.get("kind", ""))
    if kind == "cleared":
        return str(a.get("clears", "")) in LOSS_ALERT_KINDS
    return kind in LOSS_ALERT_KINDS


def health_alert_for(a: dict, key: str) -> bool:
    """Whether alert ``a`` is about health signal ``key`` (the ``key`` a health rule's alert
    carries; one without it is drawn on the watch figure only)."""
    return not is_loss_alert(a) and a.get("key") == key


@dataclass(frozen=True)
class Curve:
    """Values with their band along ``x`` (a law's or a forecast's; lo/hi NaN: no band)."""

    x: np.ndarray
    loss: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def y_limits(ys, pad: float, *, log: bool = False) -> tuple[float, float] | None:
    """(lo, hi) around the finite values of ``ys`` (positive ones on a log axis), padded by
    ``pad`` of their range; None when there is none."""
    ys = np.asarray([y for y in ys if np.isfinite(y) and (y > 0 or not log)])
    if not len(ys):
        return None
    if log:
        lo, hi = np.log(ys.min()), np.log(ys.max())
        p = pad * (hi - lo + 1e-9)
        return float(np.exp(lo - p)), float(np.exp(hi + p))
    p = pad * (ys.max() - ys.min() + 1e-9)
    return float(ys.min() - p), float(ys.max() + p)


# ----------------------------------------------------------------------------- the law


def law_follows_runs(inp: ReportInputs) -> bool:
    """Whether the law describes whole runs (loss at every fraction of the schedule: the
    trajectory form, or one law per fraction) rather than only each run's final point."""
    law = inp.law
    return law is not None and (law.form in CURVES_FORMS or law.meta.get("by") == "fraction"
                                or law.is_curve)


def law_along_run(inp: ReportInputs, run: RunData, fractions: np.ndarray):
    """The law evaluated along ``run`` at ``fractions`` of its plan (tokens and compute so far)."""
    if inp.law is None or run.planned_tokens is None:
        return None
    if inp.law.is_curve:  # a law of the LR schedule: asked along the run's own rung spec
        return None if run.rung is None else inp.law.predict(
            level=inp.level, **vars(rung_query(run.rung, fraction=fractions)))
    tokens = fractions * run.planned_tokens
    return inp.law.predict(level=inp.level, params=run.params, active_params=run.active_params,
                           tokens=tokens, compute=run.compute_at(tokens), fraction=fractions)


def law_at_sizes(inp: ReportInputs, compute: np.ndarray):
    """The law at the end of runs of ``compute``, sized by the ladder's own rule
    (:func:`allocation`): (tokens, prediction), or None without a law or a rule."""
    alloc = allocation(inp)
    if inp.law is None or alloc is None:
        return None
    kw = alloc(compute)
    return kw["tokens"], inp.law.predict(level=inp.level, fraction=np.ones_like(kw["compute"]),
                                         **kw)


def allocation(inp: ReportInputs):
    """The ladder's sizing rule read off its runs: params, active params and tokens as power laws
    of compute (so laws in (N, D) can be drawn against compute); a function compute -> dict of
    arrays, or None without a sized run."""
    pts = []
    runs = list(inp.rungs) + ([inp.target] if inp.target is not None else [])
    for r in runs:
        vals = (r.compute, r.params, r.active_params, r.planned_tokens)
        if all(v is not None and v > 0 for v in vals):
            pts.append(vals)
    ti = inp.target_info
    tv = tuple(ti.get(k) for k in ("compute", "params", "active_params", "tokens"))
    if all(isinstance(v, (int, float)) and v > 0 for v in tv):
        pts.append(tuple(float(v) for v in tv))
    if not pts:  # a law fitted from a table: the sizing of its points
        pts = [tuple(v) for v in table_finals(inp, ("compute", "params", "active_params",
                                                    "tokens"))]
    if not pts:
        return None
    arr = np.log(np.asarray(pts, float))
    lc = arr[:, 0]
    if len(np.unique(lc)) >= 2:
        coefs = [np.polyfit(lc, arr[:, j], 1) for j in range(1, 4)]
    else:  # one point: keep the ratio fixed, N and D each ~ C^0.5
        coefs = [np.array([0.5, arr[0, j] - 0.5 * lc[0]]) for j in range(1, 4)]

    def at(compute):
        x = np.log(np.asarray(compute, float))
        p, a, d = (np.exp(np.polyval(c, x)) for c in coefs)
        return {"params": p, "active_params": a, "tokens": d, "compute": np.exp(x)}
    return at


def table_finals(inp: ReportInputs, cols: tuple[str, ...]) -> np.ndarray:
    """``cols`` of each run's last point (largest fraction) in the law's points (``inp.points``),
    rows with every column positive and finite."""
    df = inp.points
    if df is None or not len(df) or not set(cols) <= set(df.columns):
        return np.zeros((0, len(cols)))
    if "run" in df.columns and "fraction" in df.columns:
        df = df.sort_values("fraction", kind="stable").groupby("run", sort=False).tail(1)
    arr = df[list(cols)].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(arr).all(axis=1) & (arr > 0).all(axis=1)
    return arr[ok]


# ----------------------------------------------------------------------------- 1. the ladder


@dataclass(frozen=True)
class RungCurve:
    """One rung on the ladder figure: its evals against tokens and the law along it."""

    name: str
    active_params: float | None
    compute: float | None
    status: str
    tokens: np.ndarray             # evals with tokens > 0
    value: np.ndarray
    final: tuple[float, float] | None   # (planned tokens, final value): a law of final points
    law: Curve | None              # the law along the run, x in tokens (a law of whole runs)
    residuals: np.ndarray          # evals / law - 1 where the law is judged (see ladder_data)


@dataclass(frozen=True)
class LadderData:
    metric: str
    level: float
    whole: bool                    # the law describes whole runs (law_follows_runs)
    law_form: str | None
    join: bool                     # no law curve per run: the points are joined instead
    rungs: tuple[RungCurve, ...]
    law_line: Curve | None         # a law of final points along the sizing rule, x in tokens
    target: RungCurve | None
    forecast: Curve | None         # the registered forecast, x in tokens
    ylim: tuple[float, float] | None
    last_values: tuple[float, ...]   # each rung's last eval

    @property
    def drew_law(self) -> bool:
        return self.law_line is not None or any(r.law is not None for r in self.rungs)

    @property
    def residuals(self) -> np.ndarray:
        """Every rung's finite residuals (empty without a law curve drawn)."""
        if not self.drew_law:
            return np.array([])
        res = np.concatenate([r.residuals for r in self.rungs]) if self.rungs else np.array([])
        return res[np.isfinite(res)]


def _rung_law(inp: ReportInputs, run: RunData, whole: bool, grid: np.ndarray):
    """(the law along ``run`` at ``grid`` fractions or None, the run's residuals observed / law
    - 1 at every eval, or for a law of final points at a complete run's final point)."""
    s = run.series(inp.metric)
    ok = np.isfinite(s.fraction) & (s.fraction > 0)
    if not whole:  # a law of final points is judged at final points only
        ok &= (s.fraction >= 0.999) & (run.status == "complete")
    at = np.unique(np.concatenate([grid, s.fraction[ok]]))
    p = law_along_run(inp, run, at) if len(at) else None
    if p is None:
        return None, np.array([])
    idx = np.searchsorted(at, s.fraction[ok])
    residuals = s.value[ok] / p.loss[idx] - 1.0
    curve = None
    if len(grid):
        g = np.searchsorted(at, grid)
        if np.isfinite(p.loss[g]).any():
            curve = Curve(grid * run.planned_tokens, p.loss[g], p.lo[g], p.hi[g])
    return curve, residuals


def _rung_curve(inp: ReportInputs, run: RunData, whole: bool) -> RungCurve:
    s = run.series(inp.metric)
    ok = np.isfinite(s.tokens) & (s.tokens > 0)
    fin = run.final(inp.metric)
    g_obs = s.fraction[ok & np.isfinite(s.fraction)]
    grid = np.array([])
    if len(g_obs) and whole:
        grid = np.unique(np.concatenate([np.linspace(g_obs.min(), max(g_obs.max(), 1.0), 80),
                                         g_obs]))
    law, res = _rung_law(inp, run, whole, grid)
    return RungCurve(run.name, run.active_params, run.compute, run.status, s.tokens[ok],
                     s.value[ok], (run.planned_tokens, fin)
                     if fin is not None and not whole and run.planned_tokens else None,
                     law, res)


def _final_points_law(inp: ReportInputs, runs: list[RunData]) -> Curve | None:
    """A law of final points along the ladder's sizing rule, from the rungs out to the
    target."""
    cs = [r.compute for r in runs if r.compute] + [inp.target_info.get("compute")]
    cs = [float(c) for c in cs if isinstance(c, (int, float)) and c > 0]
    at = law_at_sizes(inp, np.geomspace(min(cs) / 1.5, max(cs) * 1.2, 120)) if cs else None
    if at is None or at[1] is None or not np.isfinite(at[1].loss).any():
        return None
    return Curve(at[0], at[1].loss, at[1].lo, at[1].hi)


def forecast_floor(inp: ReportInputs) -> float:
    """The smallest fraction of a run a law of whole curves (fit.forms.CURVES_FORMS) was fitted
    on (``diagnostics.fraction_range`` of the pre-registration's law, else the law given): its
    forecast below is extrapolated. A tiny positive number when neither says."""
    for law in ((inp.prereg or {}).get("law"), inp.law.meta if inp.law is not None else None):
        if not isinstance(law, dict) or law.get("form") not in CURVES_FORMS:
            continue
        fr = (law.get("diagnostics") or {}).get("fraction_range")
        lo = as_float(fr[0]) if isinstance(fr, (list, tuple)) and fr else None
        if lo is not None and 0 < lo <= 1:
            return lo - 1e-9
    return 1e-12


def ladder_data(inp: ReportInputs) -> LadderData | None:
    """The ladder figure's data; None without a rung that logged the metric."""
    metric = inp.metric
    runs = [r for r in inp.rungs if len(r.series(metric))]
    if not runs:
        return None
    whole = law_follows_runs(inp)
    rungs = tuple(_rung_curve(inp, run, whole) for run in runs)
    t = inp.target
    target = None
    if t is not None and len(t.series(metric)):
        s = t.series(metric)
        ok = np.isfinite(s.tokens) & (s.tokens > 0)
        target = RungCurve(t.name, t.active_params, t.compute, t.status, s.tokens[ok],
                           s.value[ok], None, None, np.array([]))
    fc, forecast = inp.forecast, None
    if fc is not None:
        # drawn where it is forecast: from the smallest fraction the law was fitted on (below
        # it the law holds its early-transient factor constant, and on a log token axis that
        # extrapolated first stretch reads as a plateau, then a cliff)
        ok = np.isfinite(fc.tokens) & (fc.tokens > 0) & (fc.fraction >= forecast_floor(inp))
        if ok.any():
            forecast = Curve(fc.tokens[ok], fc.loss[ok], fc.lo[ok], fc.hi[ok])
    # y range from what was measured (and the target's forecast after its first 5%): early
    # forecast bands are wide and would otherwise flatten every curve
    ys = [v for r in runs + ([t] if t is not None else []) for v in r.series(metric).value]
    if fc is not None:
        m = (fc.fraction >= 0.05) & np.isfinite(fc.loss)
        ys += list(fc.loss[m])
    return LadderData(
        metric=metric, level=inp.level, whole=whole,
        law_form=inp.law.form if inp.law is not None else None,
        join=not whole or inp.law.obj is None, rungs=rungs,
        law_line=None if whole else _final_points_law(inp, runs), target=target,
        forecast=forecast, ylim=y_limits(ys, 0.06, log=True),
        last_values=tuple(float(r.series(metric).value[-1]) for r in runs))


# ----------------------------------------------------------------------------- 2. the law


def backtests(law_meta: dict) -> list[dict]:
    """Backtest rows ``{kind, label, rel_error}`` (predicted / actual - 1 at the held-out run's
    final point) of law.json's ``diagnostics.backtest.folds`` (parallel lists ``held_out``,
    ``final_rel_err``, as ``ladder fit`` writes them)."""
    diag = law_meta.get("diagnostics") if isinstance(law_meta, dict) else None
    bt = diag.get("backtest") if isinstance(diag, dict) else None
    folds = bt.get("folds") if isinstance(bt, dict) else None
    rows = []
    for f in folds if isinstance(folds, list) else []:
        if not isinstance(f, dict):
            continue
        names, errs = f.get("held_out") or [], f.get("final_rel_err") or []
        names = names if isinstance(names, list) else [names]
        errs = errs if isinstance(errs, list) else [errs]
        for name, err in zip(names, errs, strict=False):
            if isinstance(err, (int, float)) and math.isfinite(err):
                rows.append({"kind": f"fit on {f.get('train_runs', '?')} runs",
                             "label": str(name), "rel_error": float(err)})
    return rows


def form_comparison(law_meta: dict) -> list[str]:
    """One line per candidate form of ``--form auto`` (rollout error), chosen one first."""
    auto = (law_meta.get("diagnostics") or {}).get("auto") if isinstance(law_meta, dict) else None
    if not isinstance(auto, dict) or not isinstance(auto.get("candidates"), list):
        return []
    out = []
    for c in auto["candidates"]:
        if not isinstance(c, dict):
            continue
        e = c.get("rollout_mean_abs_final")
        mark = " (chosen)" if c.get("form") == auto.get("chosen") else ""
        out.append(f"{c.get('form')}: "
                   + (f"{100 * e:.2f}%" if isinstance(e, (int, float)) else "n/a") + mark)
    return out


@dataclass(frozen=True)
class LawData:
    """The law figure's data: the law at the end of a run against compute, the finished rungs
    (or the points it was fitted to), the target's forecast and actual, the backtests."""

    metric: str
    form: str | None               # None: no law given
    expression: str | None
    curve: Curve | None            # x in compute; None when the law gave nothing
    curve_level: float | None
    error: str | None              # why the law could not be drawn
    subtract: float                # E, subtracted from every loss drawn (0: not)
    E: float | None
    finals: tuple[tuple[str, float, float], ...]   # (rung, compute, final value)
    table: np.ndarray              # (n, 2): compute, loss of the law's fitted points
    table_from: str
    target_name: str | None
    target_compute: float | None
    forecast_final: dict | None    # the registered final {loss, lo, hi}
    actual: tuple[str, float] | None   # the target's final value
    backtests: list[dict]
    backtests_skipped: int         # folds the fitter skipped (too few runs)
    notes: list[str]               # band coverage of the held-out finals, forms compared


def _law_curve(inp: ReportInputs, grid) -> tuple[Curve | None, float | None]:
    """The law at the end of a run against compute: a curve law at each run with a rung spec
    (it needs a schedule), else along the ladder's sizing rule."""
    law = inp.law
    if law is not None and law.is_curve:
        pts = []
        for r in list(inp.rungs) + ([inp.target] if inp.target is not None else []):
            p = law_along_run(inp, r, np.array([1.0])) if r.compute else None
            if p is not None:
                pts.append((r.compute, p.loss[0], p.lo[0], p.hi[0]))
        if not pts:
            return None, None
        pts.sort()
        return Curve(*(np.array([p[i] for p in pts]) for i in range(4))), inp.level
    at = law_at_sizes(inp, grid) if grid is not None else None
    if at is None or at[1] is None:
        return None, None
    pred = at[1]
    return Curve(grid, pred.loss, pred.lo, pred.hi), pred.level


def law_data(inp: ReportInputs) -> LawData | None:
    """The law figure's data; None with no law, no finished rung, no points and no forecast."""
    law, metric = inp.law, inp.metric
    finals = [(r, r.final(metric)) for r in inp.rungs]
    finals = [(r, v) for r, v in finals if v is not None and r.compute]
    fc_final = inp.prereg.get("final") if inp.prereg else None
    tcomp = inp.target_info.get("compute")
    tcomp = tcomp if isinstance(tcomp, (int, float)) else None
    xs = [r.compute for r, _ in finals]
    # no runs given: the points the law was fitted to (law.json's `points` or --points)
    table = table_finals(inp, ("compute", "loss")) if not finals else np.zeros((0, 2))
    xs += list(table[:, 0])
    if tcomp is not None and tcomp > 0:
        xs.append(float(tcomp))
    if law is None and not finals and not fc_final and not len(table):
        return None
    grid = np.geomspace(min(xs) / 2, max(xs) * 2, 200) if xs else None
    curve, level = _law_curve(inp, grid)
    E = law.params.get("E") if law is not None else None
    E = float(E) if isinstance(E, (int, float)) and math.isfinite(E) else None
    ys = [v for _, v in finals] + list(table[:, 1])
    if fc_final:
        ys += [fc_final.get("loss"), fc_final.get("lo")]
    if curve is not None:
        ys += list(curve.loss[np.isfinite(curve.loss)])
    # Subtract E only when every plotted loss stays above it (a log axis cannot show <= 0),
    # and only when E is a sizeable part of the loss (an E at its lower bound ~0 changes
    # nothing but the label).
    ys = [float(y) for y in ys if isinstance(y, (int, float)) and math.isfinite(y)]
    use_e = (E is not None and bool(ys) and all(y > E for y in ys) and E > 0.05 * min(ys))
    v = inp.target.final(metric) if inp.target is not None else None
    meta = law.meta if law is not None else {}
    bt = (meta.get("diagnostics") or {}).get("backtest") if law is not None else None
    notes = form_comparison(meta) if law is not None else []
    notes = (["form chosen by rollout |error|:"] + notes) if notes else []
    cov = bt.get("band_coverage_final") if isinstance(bt, dict) else None
    if isinstance(cov, (int, float)) and math.isfinite(cov):
        notes.insert(0, f"held-out finals inside the band: {cov:.0%}")
    skipped = bt.get("skipped") if isinstance(bt, dict) else None
    return LawData(
        metric=metric, form=law.form if law is not None else None,
        expression=meta.get("expression") or None, curve=curve, curve_level=level,
        error=law.error if law is not None and curve is None else None,
        subtract=E if use_e else 0.0, E=E,
        finals=tuple((r.name, r.compute, v) for r, v in finals), table=table,
        table_from=inp.points.attrs.get("from", "law.json") if len(table) else "",
        target_name=inp.target_name, target_compute=tcomp,
        forecast_final=fc_final if isinstance(fc_final, dict) else None,
        actual=(inp.target.name, v) if v is not None and tcomp is not None else None,
        backtests=backtests(meta) if law is not None else [],
        backtests_skipped=len(skipped) if skipped else 0, notes=notes)


# ----------------------------------------------------------------------------- 3. the watch


@dataclass(frozen=True)
class LossAlert:
    """An alert about the watched metric: a line through both panels of the watch figure."""

    fraction: float
    severity: str
    kind: str
    value: float | None            # circled (a band/trend alert with its value)
    labelled: bool                 # the first of its (kind, severity): named on the figure


@dataclass(frozen=True)
class WatchData:
    """The watch figure's data: the registered band, the target's curve and its deviation from
    the forecast, the alerts where they fired, the spans where the forecast did not apply."""

    metric: str
    level: float
    name: str                      # the target's
    forecast: Curve | None         # x in fractions of the target's run
    rel_lo: np.ndarray | None      # the band relative to the forecast, in percent
    rel_hi: np.ndarray | None
    band_missing: bool
    run_label: str | None          # the target's curve, named; None: nothing logged
    run_note: str | None           # why there is no curve
    fraction: np.ndarray           # the target's evals
    value: np.ndarray
    deviation: np.ndarray | None   # actual / forecast - 1, percent
    nonfinite: tuple[float, ...]   # fractions where the metric was NaN/Inf
    spans: list[tuple[float, float]]
    loss_alerts: tuple[LossAlert, ...]
    ticks: tuple[tuple[float, str], ...]   # every other alert: (fraction, severity)
    counts: dict[str, int]         # alerts per severity
    has_alerts: bool               # an alerts file was given
    ylim: tuple[float, float] | None
    rlim: tuple[float, float] | None
    tokens_total: float | None
    verdict: dict
    updated: Curve | None = None   # the watcher's updated forecast ahead (the live page)
    train: Series | None = None    # the target's train loss (TRAIN_KEY); never sets ylim


def _placed_alerts(inp: ReportInputs):
    """The alerts on the watch figure: (loss alerts, ticks, counts per severity)."""
    lines, ticks, counts = [], [], {k: 0 for k in SEVERITIES}
    labelled = set()
    for a in inp.alerts or []:
        g = alert_fraction(a, inp)
        sev = str(a.get("severity", "info"))
        kind = str(a.get("kind", ""))
        counts[sev] = counts.get(sev, 0) + 1
        if g is None or kind == "not_applicable":
            continue
        if is_loss_alert(a):
            v = a.get("value")
            marked = kind in MARKED_KINDS and isinstance(v, (int, float))
            lines.append(LossAlert(g, sev, kind, v if marked else None,
                                   (kind, sev) not in labelled))
            labelled.add((kind, sev))
        else:
            ticks.append((g, sev))
    return tuple(lines), tuple(ticks), counts


def watch_data(inp: ReportInputs, updated: Curve | None = None) -> WatchData | None:
    """The watch figure's data; None with neither a target run nor a pre-registration."""
    t, fc, metric = inp.target, inp.forecast, inp.metric
    if t is None and fc is None:
        return None
    forecast = rel_lo = rel_hi = None
    if fc is not None:
        ok = fc.fraction > 0
        forecast = Curve(fc.fraction[ok], fc.loss[ok], fc.lo[ok], fc.hi[ok])
        rel_lo, rel_hi = 100 * (fc.lo[ok] / fc.loss[ok] - 1), 100 * (fc.hi[ok] / fc.loss[ok] - 1)
    s = t.series(metric) if t is not None else None
    fr = val = np.array([])
    dev, nonfinite, label, note = None, (), None, None
    if s is not None and len(s):
        ok = np.isfinite(s.fraction)
        fr, val = s.fraction[ok], s.value[ok]
        label = f"{t.name}: {metric} ({t.status})"
        if fc is not None:
            dev = 100 * (val / fc.at(fr)[0] - 1)
        nonfinite = tuple(g for st in t.nonfinite_steps(metric)
                          if (g := st / t.steps if t.steps else None) is not None
                          and math.isfinite(g))
    elif t is None:
        note = "no target run found: forecast only"
    else:
        note = f"{t.name}: no {metric} logged yet"
    # the y ranges: the band and the curve after the first 5% of the run (the first evals sit
    # far above); the deviation panel's alike, in percent
    ys, rs = [], [0.0]
    if fc is not None:
        m = fc.fraction >= 0.05
        ys += list(fc.lo[m]) + list(fc.hi[m])
        m &= fc.loss > 0
        rs += list(100 * (fc.lo[m] / fc.loss[m] - 1)) + list(100 * (fc.hi[m] / fc.loss[m] - 1))
    if s is not None and len(s):
        m = s.fraction >= 0.05
        ys += list(s.value[m])
        if fc is not None:
            rs += list(100 * (s.value[m] / fc.at(s.fraction[m])[0] - 1))
    rs = [r for r in rs if np.isfinite(r)]
    tr = t.series(TRAIN_KEY) if t is not None and metric != TRAIN_KEY else None
    train = None
    if tr is not None and np.isfinite(tr.fraction).any():
        ok = np.isfinite(tr.fraction)
        train = Series(tr.step[ok], tr.fraction[ok], tr.tokens[ok], tr.value[ok])
    loss_alerts, ticks, counts = _placed_alerts(inp)
    tokens_total = inp.target_info.get("tokens") or (t.planned_tokens if t else None)
    return WatchData(
        metric=metric, level=inp.level,
        name=t.name if t is not None else (inp.target_name or "target"), forecast=forecast,
        rel_lo=rel_lo, rel_hi=rel_hi,
        band_missing=fc is not None and not np.isfinite(fc.lo).any(), run_label=label,
        run_note=note, fraction=fr, value=val, deviation=dev, nonfinite=nonfinite,
        spans=not_applicable_spans(inp), loss_alerts=loss_alerts, ticks=ticks, counts=counts,
        has_alerts=inp.alerts is not None,
        ylim=y_limits(ys, 0.08),
        rlim=y_limits(rs, 0.1) if len(rs) > 1 else None,
        tokens_total=tokens_total if isinstance(tokens_total, (int, float))
        and tokens_total > 0 else None,
        verdict=inp.verdict, updated=updated, train=train)
