"""The report's figures. Each is a pure function of loaded artifacts (:class:`ReportInputs`) and
returns a matplotlib ``Figure`` (or None when its artifacts are missing). Evaluating the exported
law (``law.predict``) is allowed: it is part of the law artifact; nothing is refitted.

Built on ``matplotlib.figure.Figure`` without pyplot, so no global state and no display backend
(PNG rendering goes through Agg).
"""

from __future__ import annotations

import functools
import io
import math
import textwrap

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    NullLocator,
)

from fit.forms import CURVES_FORMS
from predict.planned import rung_query
from predict.watch import SEVERITIES, alert_kinds, health_alert_kinds
from reports.inputs import ReportInputs, RunData, not_applicable_spans
from reports.inputs import alert_fraction as _alert_fraction
from reports.style import (
    FORECAST_COLOR,
    LAW_COLOR,
    NOT_APPLICABLE_COLOR,
    RC,
    SEVERITY_COLORS,
    TARGET_COLOR,
    rung_colors,
    sci,
    si,
)
from reports.style import loss_fmt as num

HEALTH_KEYS = ("moe/drop_frac", "grad/norm", "moe/router_entropy", "params/norm/router_bias",
               "moe/load_max_over_mean")
HEALTH_LABELS = {
    "moe/drop_frac": ("token-drop fraction", "fraction of assignments dropped"),
    "grad/norm": ("gradient norm", "global L2 norm"),
    "moe/router_entropy": ("router entropy", "nats"),
    "params/norm/router_bias": ("router-bias norm (rule-set, not trained)", "L2 norm"),
    "moe/load_max_over_mean": ("expert load imbalance", "max load / mean load"),
}
# Alert kinds about the watched metric itself: those of the watcher's rules drawn on the watch plot
# (predict.watch.RULES, panel "watch"); spikes and health alerts are ticks on its top edge.
LOSS_ALERT_KINDS = alert_kinds("watch")

def _is_loss_alert(a: dict) -> bool:
    """About the watched metric: by the alert's ``kind`` (a "cleared" alert, which several rules
    raise, by the kind it ``clears``), as the watcher's rules define them."""
    kind = str(a.get("kind", ""))
    if kind == "cleared":
        return str(a.get("clears", "")) in LOSS_ALERT_KINDS
    return kind in LOSS_ALERT_KINDS


def png_bytes(fig) -> bytes:
    """``fig`` as PNG bytes on a white background (the report's files and the live page)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()


def _health_alert_for(a: dict, key: str) -> bool:
    """Whether alert ``a`` is about health signal ``key``: the metric ``key`` the watcher wrote
    into it, else (alerts of older watchers) one of the kinds its rules raise about ``key``."""
    if _is_loss_alert(a):
        return False
    if isinstance(a.get("key"), str):
        return a["key"] == key
    kind = a.get("clears") if a.get("kind") == "cleared" else a.get("kind")
    return kind in HEALTH_ALERT_KINDS.get(key, ())


# Alert kinds drawn on a health panel as well as on the watch plot: per key, those of the rules
# that read it (predict.watch.RULES, panel "health", and the non-finite rule).
HEALTH_ALERT_KINDS = health_alert_kinds()

def _styled(func):
    """Apply the report's rcParams while a figure is built (axes read them when created)."""
    @functools.wraps(func)
    def wrapper(*args, **kw):
        with rc_context(RC):
            return func(*args, **kw)
    return wrapper


def _fig(w: float, h: float) -> Figure:
    return Figure(figsize=(w, h), layout="constrained")


def _plain_log_y(ax) -> None:
    """Log y axis labelled with plain numbers (losses 2.1, 2.5, 3 rather than 10^0.3). Within
    less than a decade, log locators give two or three ticks; there the ticks are chosen as
    round linear values instead (call after the limits are settled)."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo < 10:
        cand = MaxNLocator(7, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
        ticks = [t for t in cand if lo <= t <= hi and t > 0]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _pct_x(ax) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))


def _si_x(ax) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: si(v)))


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=10,
            color="#666666", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def colors_for(inp: ReportInputs) -> dict[str, str]:
    return rung_colors([r.name for r in inp.rungs])


def _metric_label(metric: str) -> str:
    return f"{metric} (nats/token)" if metric.endswith("loss") else metric


# ----------------------------------------------------------------------------- 1. the ladder


def law_follows_runs(inp: ReportInputs) -> bool:
    """Whether the law describes whole runs (loss at every fraction of the schedule: the
    trajectory form, or one law per fraction) rather than only each run's final point."""
    law = inp.law
    return law is not None and (law.form in CURVES_FORMS or law.meta.get("by") == "fraction"
                                or law.is_curve)


def _law_along_run(inp: ReportInputs, run: RunData, fractions: np.ndarray):
    """The law evaluated along ``run`` at ``fractions`` of its plan (tokens and compute so far)."""
    if inp.law is None or run.planned_tokens is None:
        return None
    if inp.law.is_curve:  # a law of the LR schedule: asked along the run's own rung spec
        return None if run.rung is None else inp.law.predict(
            level=inp.level, **vars(rung_query(run.rung, fraction=fractions)))
    tokens = fractions * run.planned_tokens
    return inp.law.predict(level=inp.level, params=run.params, active_params=run.active_params,
                           tokens=tokens, compute=run.compute_at(tokens), fraction=fractions)


def ladder_residuals(inp: ReportInputs) -> np.ndarray:
    """Relative residuals (observed / law - 1) of every rung's eval points (empty without a law)."""
    out = []
    whole = law_follows_runs(inp)
    for run in inp.rungs:
        s = run.series(inp.metric)
        ok = np.isfinite(s.fraction) & (s.fraction > 0)
        if not whole:  # a law of final points is judged at final points only
            ok &= s.fraction >= 0.999
            ok &= run.status == "complete"
        if not ok.any():
            continue
        p = _law_along_run(inp, run, s.fraction[ok])
        if p is not None:
            out.append(s.value[ok] / p.loss - 1.0)
    return np.concatenate(out) if out else np.array([])


@_styled
def plot_ladder(inp: ReportInputs) -> Figure | None:
    metric = inp.metric
    runs = [r for r in inp.rungs if len(r.series(metric))]
    if not runs:
        return None
    colors = colors_for(inp)
    fig = _fig(9.5, 5.6)
    ax = fig.add_subplot()
    drew_law = drew_band = False
    whole = law_follows_runs(inp)
    for run in runs:
        s = run.series(metric)
        c = colors[run.name]
        ok = np.isfinite(s.tokens) & (s.tokens > 0)
        label = f"{run.name}  ({si(run.active_params)} active, {sci(run.compute, 2)} FLOPs)"
        if run.status != "complete":
            label += f"  [{run.status}]"
        ax.plot(s.tokens[ok], s.value[ok], "o", color=c, ms=4.5, mec="white", mew=0.5,
                label=label, zorder=3)
        if not whole or inp.law.obj is None:  # no law curve per run: join the points instead
            ax.plot(s.tokens[ok], s.value[ok], "-", color=c, lw=0.8, alpha=0.6, zorder=2)
        fin = run.final(metric)
        if fin is not None and not whole and run.planned_tokens:
            ax.plot([run.planned_tokens], [fin], "o", color=c, ms=8, mec=TARGET_COLOR, mew=1,
                    zorder=4)
        g_obs = s.fraction[ok & np.isfinite(s.fraction)]
        if len(g_obs) and whole:
            grid = np.unique(np.concatenate([np.linspace(g_obs.min(), max(g_obs.max(), 1.0), 80),
                                             g_obs]))
            p = _law_along_run(inp, run, grid)
            if p is not None and np.isfinite(p.loss).any():
                drew_law = True
                t = grid * run.planned_tokens
                ax.plot(t, p.loss, "-", color=c, lw=1.6, alpha=0.9, zorder=2)
                # No per-rung band here: the rungs overlap in tokens and their bands would
                # hide the points; the law's band is drawn in the law and watch figures.
    alloc = _allocation(inp)
    if inp.law is not None and not whole and alloc is not None:
        # A law of final points: one line through the rungs' end points, along the ladder's own
        # sizing rule (params and tokens as power laws of compute), out to the target.
        cs = [r.compute for r in runs if r.compute] + [inp.target_info.get("compute")]
        cs = [float(c) for c in cs if isinstance(c, (int, float)) and c > 0]
        if cs:
            kw = alloc(np.geomspace(min(cs) / 1.5, max(cs) * 1.2, 120))
            p = inp.law.predict(level=inp.level, fraction=np.ones_like(kw["compute"]), **kw)
            if p is not None and np.isfinite(p.loss).any():
                drew_law = True
                ax.plot(kw["tokens"], p.loss, "-", color=LAW_COLOR, lw=1.8, zorder=2)
                if np.isfinite(p.lo).any():
                    drew_band = True
                    ax.fill_between(kw["tokens"], p.lo, p.hi, color=LAW_COLOR, alpha=0.12, lw=0)
    t = inp.target
    if t is not None and len(t.series(metric)):
        s = t.series(metric)
        ok = np.isfinite(s.tokens) & (s.tokens > 0)
        ax.plot(s.tokens[ok], s.value[ok], "s", color=TARGET_COLOR, ms=4.5,
                label=f"{t.name} (target; {si(t.active_params)} active)", zorder=4)
    fc = inp.forecast
    if fc is not None:
        ok = np.isfinite(fc.tokens) & (fc.tokens > 0) & (fc.fraction > 0)
        if ok.any():
            ax.plot(fc.tokens[ok], fc.loss[ok], "--", color=TARGET_COLOR, lw=1.2,
                    label=f"target: pre-registered forecast (shaded: {inp.level:.0%} band)",
                    zorder=2)
            ax.fill_between(fc.tokens[ok], fc.lo[ok], fc.hi[ok], color=TARGET_COLOR, alpha=0.08,
                            lw=0)
    ax.set_xscale("log")
    _si_x(ax)
    # y range from what was measured (and the target's forecast after its first 5%): early
    # forecast bands are wide and would otherwise flatten every curve.
    ys = [v for r in runs + ([t] if t is not None else []) for v in r.series(metric).value]
    if fc is not None:
        m = (fc.fraction >= 0.05) & np.isfinite(fc.loss)
        ys += list(fc.loss[m])
    ys = np.asarray([y for y in ys if np.isfinite(y) and y > 0])
    if len(ys):
        lo, hi = np.log(ys.min()), np.log(ys.max())
        pad = 0.06 * (hi - lo + 1e-9)
        ax.set_ylim(np.exp(lo - pad), np.exp(hi + pad))
    _plain_log_y(ax)
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel(_metric_label(metric))
    handles, labels = ax.get_legend_handles_labels()
    if drew_law:
        what = "along each run" if whole else "through the final points (large dots)"
        handles.append(Line2D([], [], color="#555555" if whole else LAW_COLOR, lw=1.6))
        band = ""
        if not whole:
            band = (f", shaded: {inp.level:.0%} band" if drew_band
                    else "; band missing (could not be computed)")
        labels.append(f"law ({inp.law.form}) {what}{band}")
    ax.legend(handles, labels, loc="upper right")
    res = ladder_residuals(inp) if drew_law else np.array([])
    res = res[np.isfinite(res)]
    first = [r.series(metric).value[-1] for r in runs]
    if len(res):
        pts = "eval points" if whole else "final points"
        title = (f"The law tracks the ladder: median |error| {np.median(np.abs(res)):.2%}, max "
                 f"{np.abs(res).max():.2%} over {len(res)} {pts} of {len(runs)} rungs")
    elif inp.law is None:
        title = (f"Ladder: {len(runs)} rungs, last {metric} {num(max(first))} -> "
                 f"{num(min(first))} (no law given)")
    else:
        title = f"Ladder: {len(runs)} rungs; the law could not be evaluated along them"
    ax.set_title(title, loc="left")
    return fig


# ----------------------------------------------------------------------------- 2. the law


def _allocation(inp: ReportInputs):
    """params, active params and tokens as power laws of compute through the rungs and the target
    (the ladder's own sizing rule, read off its runs), so that laws in (N, D) can be drawn against
    compute. Returns a function compute -> dict of arrays, or None with fewer than one point."""
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
        pts = [tuple(v) for v in _table_finals(inp, ("compute", "params", "active_params",
                                                     "tokens"))]
    if not pts:
        return None
    arr = np.log(np.asarray(pts, float))
    lc = arr[:, 0]
    coefs = []
    for j in range(1, 4):
        if len(np.unique(lc)) >= 2:
            coefs.append(np.polyfit(lc, arr[:, j], 1))
        else:  # one point: keep the ratio fixed, N and D each ~ C^0.5
            coefs.append(np.array([0.5, arr[0, j] - 0.5 * lc[0]]))

    def at(compute):
        x = np.log(np.asarray(compute, float))
        p, a, d = (np.exp(np.polyval(c, x)) for c in coefs)
        return {"params": p, "active_params": a, "tokens": d, "compute": np.exp(x)}
    return at


def _table_finals(inp: ReportInputs, cols: tuple[str, ...]) -> np.ndarray:
    """Rows of ``cols`` of the law's points (``inp.points``): each run's last point (largest
    fraction), only rows where every column is a positive finite number; (0, len(cols)) when
    there are none."""
    df = inp.points
    if df is None or not len(df) or not set(cols) <= set(df.columns):
        return np.zeros((0, len(cols)))
    if "run" in df.columns and "fraction" in df.columns:
        df = df.sort_values("fraction", kind="stable").groupby("run", sort=False).tail(1)
    arr = df[list(cols)].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(arr).all(axis=1) & (arr > 0).all(axis=1)
    return arr[ok]


def backtests(law_meta: dict) -> list[dict]:
    """Backtest rows of ``law.json`` diagnostics: ``{kind, label, rel_error}`` with rel_error =
    predicted / actual - 1 at the held-out run's final point.

    The fitter's layout (``diagnostics.backtest.folds``: ``train_runs``, ``held_out`` and
    ``final_rel_err`` as parallel lists) is read first; other layouts are searched tolerantly for
    entries with a relative error (``rel_error``/``relative_error``/``error``) and a run name.
    """
    diag = law_meta.get("diagnostics") if isinstance(law_meta, dict) else None
    if not isinstance(diag, dict):
        return []
    bt = diag.get("backtest")
    if isinstance(bt, dict) and isinstance(bt.get("folds"), list):
        rows = []
        for f in bt["folds"]:
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
    rows: list[dict] = []
    err_keys = ("rel_error", "relative_error", "rel_err", "error")
    name_keys = ("held_out", "run", "target", "name", "heldout", "predict")

    def visit(obj, kind: str):
        if isinstance(obj, list):
            for x in obj:
                visit(x, kind)
        elif isinstance(obj, dict):
            err = next((obj[k] for k in err_keys if isinstance(obj.get(k), (int, float))), None)
            if err is not None:
                label = next((obj[k] for k in name_keys if isinstance(obj.get(k), (str, int))), "")
                rows.append({"kind": kind, "label": str(label), "rel_error": float(err)})
                return
            for k, v in obj.items():
                visit(v, f"{kind}/{k}" if kind else k)

    for key, val in diag.items():
        if "backtest" in key.lower():
            visit(val, "" if key.lower() == "backtests" else key)
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
        if isinstance(e, (int, float)):
            out.append(f"{c.get('form')}: {100 * e:.2f}%{mark}")
        else:
            out.append(f"{c.get('form')}: n/a{mark}")
    return out


@_styled
def plot_law(inp: ReportInputs) -> Figure | None:
    law, metric = inp.law, inp.metric
    finals = [(r, r.final(metric)) for r in inp.rungs]
    finals = [(r, v) for r, v in finals if v is not None and r.compute]
    fc_final = inp.prereg.get("final") if inp.prereg else None
    tcomp = inp.target_info.get("compute")
    colors = colors_for(inp)
    fig = _fig(12.5, 5.4)
    gs = fig.add_gridspec(1, 2, width_ratios=[2.3, 1])
    ax, axb = fig.add_subplot(gs[0]), fig.add_subplot(gs[1])
    E = law.params.get("E") if law is not None else None
    E = float(E) if isinstance(E, (int, float)) and math.isfinite(E) else None

    xs = [r.compute for r, _ in finals]
    # no runs given: the points the law was fitted to (law.json's `points` or --points)
    table = _table_finals(inp, ("compute", "loss")) if not finals else np.zeros((0, 2))
    xs += list(table[:, 0])
    if isinstance(tcomp, (int, float)) and tcomp > 0:
        xs.append(float(tcomp))
    if law is None and not finals and not fc_final and not len(table):
        return None
    grid = np.geomspace(min(xs) / 2, max(xs) * 2, 200) if xs else None
    pred = None
    alloc = _allocation(inp)
    if law is not None and law.is_curve:
        # A curve law needs each run's schedule: its end-of-run value at each run with a rung
        # spec (the ladder and the target), joined by a line, instead of a continuous curve.
        pts = []
        for r in list(inp.rungs) + ([inp.target] if inp.target is not None else []):
            p = law.predict(level=inp.level, **vars(rung_query(r.rung, fraction=np.array([1.0])))
                            ) if r.compute and r.rung is not None else None
            if p is not None:
                pts.append((r.compute, p.loss[0], p.lo[0], p.hi[0]))
        if pts:
            pts.sort()
            grid = np.array([p[0] for p in pts])
            pred = type("P", (), {})()
            pred.loss, pred.lo, pred.hi = (np.array([p[i] for p in pts]) for i in (1, 2, 3))
            pred.level = inp.level
    elif law is not None and grid is not None and alloc is not None:
        kw = alloc(grid)
        pred = law.predict(level=inp.level, fraction=np.ones_like(grid), **kw)
    ys = [v for _, v in finals] + list(table[:, 1])
    if fc_final:
        ys += [fc_final.get("loss"), fc_final.get("lo")]
    if pred is not None:
        ys += list(pred.loss[np.isfinite(pred.loss)])
    # Subtract E only when every plotted loss stays above it (a log axis cannot show <= 0).
    ys = [float(y) for y in ys if isinstance(y, (int, float)) and math.isfinite(y)]
    # ... and only when E is a sizeable part of the loss (an E at its lower bound ~0 changes
    # nothing but the label).
    use_e = (E is not None and bool(ys) and all(y > E for y in ys) and E > 0.05 * min(ys))
    sub = E if use_e else 0.0

    if pred is not None:
        ax.plot(grid, pred.loss - sub, "-", color=LAW_COLOR, lw=2,
                label=f"law ({law.form}) at the end of a run")
        if np.isfinite(pred.lo).any():
            lo = np.where(pred.lo - sub > 0, pred.lo - sub, np.nan)
            ax.fill_between(grid, lo, pred.hi - sub, color=LAW_COLOR, alpha=0.15, lw=0,
                            label=f"{pred.level:.0%} prediction band")
        else:
            ax.plot([], [], " ", label="band: could not be computed (missing, not zero)")
    for r, v in finals:
        ax.plot(r.compute, v - sub, "o", color=colors[r.name], ms=8, mec="white", mew=0.8,
                zorder=4, label=f"{r.name}: {num(v)}")
    if len(table):
        n = len(table)
        ax.plot(table[:, 0], table[:, 1] - sub, "o", color="#495057", ms=5 if n > 50 else 7,
                alpha=0.7, mec="white", mew=0.5, zorder=4,
                label=f"fitted points: the last of each of {n} run{'s' if n != 1 else ''} "
                      f"(from {inp.points.attrs.get('from', 'law.json')})")
    if fc_final and isinstance(tcomp, (int, float)):
        f, lo, hi = (fc_final.get(k) for k in ("loss", "lo", "hi"))
        if isinstance(f, (int, float)):
            yerr = None
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
                yerr = [[f - lo], [hi - f]]
            ax.errorbar([tcomp], [f - sub], yerr=yerr, fmt="D", color=TARGET_COLOR, ms=8,
                        capsize=6, lw=2, zorder=5,
                        label=f"{inp.target_name or 'target'} forecast: {num(f)} "
                              f"[{num(lo)}, {num(hi)}]")
    if inp.target is not None:
        v = inp.target.final(metric)
        if v is not None and isinstance(tcomp, (int, float)):
            ax.plot([tcomp], [v - sub], "*", color="#e8590c", ms=15, mec=TARGET_COLOR, mew=0.8,
                    zorder=6, label=f"{inp.target.name} actual: {num(v)}")
    ax.set_xscale("log")
    _plain_log_y(ax)
    ax.set_xlabel("training compute C (FLOPs, no LM head)")
    ax.set_ylabel(f"{metric} - E  (E = {num(E)})" if use_e else _metric_label(metric))
    if ax.get_legend_handles_labels()[0]:  # an old law.json without points has nothing to name
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    if law is not None and law.meta.get("expression"):
        expr = textwrap.fill(f"law: {law.meta['expression']}", 110)
        ax.set_title(expr, loc="left", fontsize=8, color="#555555", fontweight="normal")
    if fc_final and isinstance(fc_final.get("loss"), (int, float)) and finals and \
            isinstance(tcomp, (int, float)):
        ratio = tcomp / max(r.compute for r, _ in finals)
        title = (f"Forecast for {inp.target_name or 'the target'}: {num(fc_final['loss'])} "
                 f"[{num(fc_final.get('lo'))}, {num(fc_final.get('hi'))}], "
                 f"{ratio:.3g}x the largest rung's compute")
    elif law is not None and not finals and len(table):
        title = f"The {law.form} law through the {len(table)} runs it was fitted to"
    elif law is not None:
        title = f"The {law.form} law through {len(finals)} finished rungs"
    else:
        title = f"{len(finals)} finished rungs (no law given)"
    fig.suptitle(title, x=0.01, ha="left", fontsize=12)
    if law is not None and law.error and pred is None:
        ax.text(0.02, 0.98, "fitted line unavailable:\n" + law.error[:120], transform=ax.transAxes,
                va="top", fontsize=8, color="#a61e4d")

    rows = backtests(law.meta) if law is not None else []
    if rows:
        labels = [f"{r['label']}\n({r['kind']})" if r["kind"] else r["label"] for r in rows]
        vals = np.array([100 * r["rel_error"] for r in rows])
        y = np.arange(len(rows))
        axb.barh(y, vals, color=["#c92a2a" if v > 0 else "#1971c2" for v in vals], height=0.5)
        axb.set_ylim(max(len(rows), 5) - 0.5, -0.5)  # fixed bar thickness for few rows
        axb.set_yticks(y, labels, fontsize=8)
        axb.axvline(0, color="#333333", lw=0.8)
        for yi, v in zip(y, vals, strict=True):
            axb.text(v, yi, f" {v:+.2f}% ", va="center", ha="left" if v >= 0 else "right",
                     fontsize=8)
        lim = max(np.abs(vals).max() * 1.6, 0.1)
        axb.set_xlim(-lim, lim)
        axb.set_xlabel("relative error of held-out prediction (%)\n(predicted / actual - 1)")
        axb.grid(axis="y", visible=False)
        axb.set_title(f"Backtests\nheld-out runs within {np.abs(vals).max():.2f}%", loc="left")
    else:
        why = "no law given"
        if law is not None:
            bt = (law.meta.get("diagnostics") or {}).get("backtest")
            skipped = bt.get("skipped") if isinstance(bt, dict) else None
            why = "no backtest errors in law.json"
            if skipped:
                why += f"\n({len(skipped)} folds skipped:\ntoo few runs for the form)"
        _note(axb, why)
        axb.set_title("Backtests", loc="left")
    comp = form_comparison(law.meta) if law is not None else []
    comp = (["form chosen by rollout |error|:"] + comp) if comp else []
    bt = (law.meta.get("diagnostics") or {}).get("backtest") if law is not None else None
    cov = bt.get("band_coverage_final") if isinstance(bt, dict) else None
    if isinstance(cov, (int, float)) and math.isfinite(cov):
        comp.insert(0, f"held-out finals inside the band: {cov:.0%}")
    if comp:
        axb.text(0.02, 0.02, "\n".join(comp),
                 transform=axb.transAxes, fontsize=7.5, va="bottom", color="#444444",
                 bbox={"facecolor": "white", "edgecolor": "#dddddd", "alpha": 0.9})
    return fig


# ----------------------------------------------------------------------------- 3. the watch


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


@_styled
def plot_watch(inp: ReportInputs) -> Figure | None:
    t, fc, metric = inp.target, inp.forecast, inp.metric
    if t is None and fc is None:
        return None
    fig = _fig(11, 7.2)
    gs = fig.add_gridspec(2, 1, height_ratios=[2.2, 1], hspace=0.05)
    ax = fig.add_subplot(gs[0])
    axr = fig.add_subplot(gs[1], sharex=ax)
    lvl = f"{inp.level:.0%}"
    if fc is not None:
        ok = fc.fraction > 0
        ax.fill_between(fc.fraction[ok], fc.lo[ok], fc.hi[ok], color=FORECAST_COLOR, alpha=0.18,
                        lw=0, label=f"pre-registered {lvl} band")
        ax.plot(fc.fraction[ok], fc.loss[ok], "--", color=FORECAST_COLOR, lw=1.4,
                label="pre-registered forecast")
        rel_lo = fc.lo[ok] / fc.loss[ok] - 1
        rel_hi = fc.hi[ok] / fc.loss[ok] - 1
        axr.fill_between(fc.fraction[ok], 100 * rel_lo, 100 * rel_hi, color=FORECAST_COLOR,
                         alpha=0.18, lw=0)
        axr.axhline(0, color=FORECAST_COLOR, ls="--", lw=1.2)
        if not np.isfinite(fc.lo).any():
            ax.text(0.5, 0.02, "band missing in prereg (could not be computed)",
                    transform=ax.transAxes, ha="center", color="#a61e4d")
    else:
        axr.text(0.5, 0.5, "no pre-registration given: no forecast to compare with",
                 transform=axr.transAxes, ha="center", va="center", color="#666666")
        axr.set_yticks([])
    s = t.series(metric) if t is not None else None
    if s is not None and len(s):
        ok = np.isfinite(s.fraction)
        ax.plot(s.fraction[ok], s.value[ok], "-o", color=TARGET_COLOR, lw=2, ms=3.5,
                label=f"{t.name}: {metric} ({t.status})", zorder=4)
        if fc is not None:
            f, _, _ = fc.at(s.fraction[ok])
            axr.plot(s.fraction[ok], 100 * (s.value[ok] / f - 1), "-o", color=TARGET_COLOR,
                     lw=2, ms=3.5, zorder=4)
        for st in t.nonfinite_steps(metric):
            g = st / t.steps if t.steps else None
            if g is not None and math.isfinite(g):
                ax.axvline(g, color=SEVERITY_COLORS["critical"], lw=2, ls=":")
    elif t is None:
        _note_text = "no target run found: forecast only"
        ax.text(0.5, 0.9, _note_text, transform=ax.transAxes, ha="center", color="#666666")
    else:
        ax.text(0.5, 0.9, f"{t.name}: no {metric} logged yet", transform=ax.transAxes,
                ha="center", color="#666666")

    for g0, g1 in not_applicable_spans(inp):
        for a in (ax, axr):
            a.axvspan(g0, g1, color=NOT_APPLICABLE_COLOR, alpha=0.35, hatch="//", lw=0, zorder=0)
    # Alerts about the loss are vertical lines through both panels, labelled with their kind;
    # every other alert (health, spikes, cleared) is a triangle on the top edge, so a run with
    # many health warnings stays readable (they are drawn in full on the health figure).
    seen_line, seen_tick, counts = set(), set(), {k: 0 for k in SEVERITIES}
    labelled = set()
    for a in inp.alerts or []:
        g = _alert_fraction(a, inp)
        sev = str(a.get("severity", "info"))
        kind = str(a.get("kind", ""))
        counts[sev] = counts.get(sev, 0) + 1
        if g is None or kind == "not_applicable":
            continue
        c = SEVERITY_COLORS.get(sev, SEVERITY_COLORS["info"])
        if _is_loss_alert(a):
            for axx in (ax, axr):
                axx.axvline(g, color=c, lw=1.6 if sev != "info" else 0.8, alpha=0.85, zorder=1)
            v = a.get("value")
            marked = ("above_band", "below_band", "trend", "rising")
            if kind in marked and isinstance(v, (int, float)):
                ax.plot([g], [v], "o", ms=11, mfc="none", mec=c, mew=2, zorder=5)
            if (kind, sev) not in labelled:
                labelled.add((kind, sev))
                ax.text(g, 0.985, f" {kind} ({sev})", transform=ax.get_xaxis_transform(),
                        rotation=90, va="top", ha="left", fontsize=7.5, color=c)
            seen_line.add(sev)
        else:
            ax.plot([g], [1.0], "v", ms=7, color=c, transform=ax.get_xaxis_transform(),
                    clip_on=False, zorder=6, mec="white", mew=0.5)
            seen_tick.add(sev)
    ax.set_ylabel(_metric_label(metric))
    axr.set_ylabel("actual / forecast - 1 (%)")
    axr.set_xlabel("fraction of the target's planned run")
    _pct_x(axr)
    ax.tick_params(labelbottom=False)
    ax.set_xlim(0, 1.0)
    # y limits from the band and the curve after the first 5% (the first evals sit far above)
    ys = []
    if fc is not None:
        m = fc.fraction >= 0.05
        ys += list(fc.lo[m]) + list(fc.hi[m])
    if s is not None and len(s):
        ys += list(s.value[s.fraction >= 0.05])
    ys = np.asarray([y for y in ys if np.isfinite(y)])
    if len(ys):
        pad = 0.08 * (ys.max() - ys.min() + 1e-9)
        ax.set_ylim(ys.min() - pad, ys.max() + pad)
    rs = []  # the same for the deviation panel, in percent
    if fc is not None:
        m = (fc.fraction >= 0.05) & (fc.loss > 0)
        rs += list(100 * (fc.lo[m] / fc.loss[m] - 1)) + list(100 * (fc.hi[m] / fc.loss[m] - 1))
        if s is not None and len(s):
            m = s.fraction >= 0.05
            rs += list(100 * (s.value[m] / fc.at(s.fraction[m])[0] - 1))
    rs = np.asarray([r for r in rs if np.isfinite(r)] + [0.0])
    if len(rs) > 1:
        pad = 0.1 * (rs.max() - rs.min() + 1e-9)
        axr.set_ylim(rs.min() - pad, rs.max() + pad)
    tokens_total = inp.target_info.get("tokens") or (t.planned_tokens if t else None)
    if isinstance(tokens_total, (int, float)) and tokens_total > 0:
        sec = ax.secondary_xaxis("top", functions=(lambda g: g * tokens_total,
                                                    lambda x: x / tokens_total))
        sec.xaxis.set_major_formatter(FuncFormatter(lambda v, _: si(v)))
        sec.set_xlabel("tokens seen")
    handles, labels = ax.get_legend_handles_labels()
    if fc is not None and not np.isfinite(fc.lo).any():
        keep = [i for i, lab in enumerate(labels) if "band" not in lab]
        handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
    for sev in SEVERITIES:
        if sev in seen_line:
            handles.append(Line2D([], [], color=SEVERITY_COLORS[sev], lw=1.5))
            labels.append(f"{sev}: loss alert")
        if sev in seen_tick:
            handles.append(Line2D([], [], color=SEVERITY_COLORS[sev], marker="v", ls=""))
            labels.append(f"{sev}: other alert (health, spikes)")
    if not_applicable_spans(inp):
        handles.append(Patch(facecolor=NOT_APPLICABLE_COLOR, alpha=0.35, hatch="//"))
        labels.append("forecast does not apply")
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(handles)))
    v = watch_verdict(inp)
    name = t.name if t is not None else (inp.target_name or "target")
    if "not_applicable_since" in v:
        where = "final" if v["complete"] else f"at {v['fraction']:.0%} of the run"
        title = (f"{name} {where}: {num(v['actual'])} vs forecast {num(v['forecast'])}; the "
                 f"forecast no longer applies since {v['not_applicable_since']:.0%}: not judged")
    elif "inside" in v:
        where = "final" if v["complete"] else f"at {v['fraction']:.0%} of the run"
        state = "inside" if v["inside"] else ("ABOVE" if v["actual"] > v["hi"] else "BELOW")
        title = (f"{name} {where}: {num(v['actual'])} vs forecast {num(v['forecast'])} "
                 f"[{num(v['lo'])}, {num(v['hi'])}] -> {state} the {lvl} band")
    elif v.get("band_missing"):
        where = "final" if v["complete"] else f"at {v['fraction']:.0%} of the run"
        title = (f"{name} {where}: {num(v['actual'])} vs forecast {num(v['forecast'])} "
                 f"({v['actual'] / v['forecast'] - 1:+.1%}); band missing, cannot judge")
    elif fc is None:
        title = f"{name}: no pre-registered forecast to compare with"
    else:
        title = f"{name}: pre-registered forecast, no live points yet"
    n_bad = counts.get("warn", 0) + counts.get("critical", 0)
    if inp.alerts is not None:
        title += f"; {n_bad} warning/critical alert{'s' if n_bad != 1 else ''}"
    fig.suptitle(textwrap.fill(title, 110), x=0.01, ha="left", fontsize=12)
    return fig


# ----------------------------------------------------------------------------- 4. health


def health_keys(inp: ReportInputs) -> list[str]:
    present: set[str] = set()
    for r in list(inp.rungs) + ([inp.target] if inp.target is not None else []):
        present |= r.keys()
    keys = [k for k in HEALTH_KEYS if k in present]
    keys += sorted(k for k in present if k.startswith("params/norm/") and k not in keys)
    return keys


SMOOTH_FRACTION = 0.02  # health lines: rolling median over 2% of each run's own schedule


def _smooth(x: np.ndarray, y: np.ndarray, width: float = SMOOTH_FRACTION):
    """Centred rolling median over ``width`` of the run (x in fractions), so that per-step signals
    of runs with 60 or 20,000 steps read alike; evaluated at no more than ~400 x positions."""
    n = len(y)
    if n < 3:
        return x, y
    span = np.nanmax(x) - np.nanmin(x)
    if not span > 0:
        return x, y
    per = max(1, round(width / (span / max(n - 1, 1))))  # points per window
    if per <= 1:
        return x, y
    import pandas as pd  # rolling median without a Python loop; lazy (only health needs it)
    ys = pd.Series(y).rolling(per, center=True, min_periods=1).median().to_numpy()
    step = max(1, n // 400)
    return x[::step], ys[::step]


def _at_fraction(run: RunData, key: str, g: float) -> float | None:
    """``key`` of ``run`` around fraction ``g`` (median over the smoothing window), if logged."""
    s = run.series(key)
    m = np.isfinite(s.fraction) & (np.abs(s.fraction - g) <= SMOOTH_FRACTION / 2 + 1e-9)
    if not m.any():
        return None
    return float(np.median(s.value[m]))


def _fmt_health(key: str, v: float) -> str:
    return f"{v:.1%}" if key == "moe/drop_frac" else f"{v:.3g}"


@_styled
def plot_health(inp: ReportInputs) -> Figure | None:
    keys = health_keys(inp)
    if not keys:
        return None
    colors = colors_for(inp)
    ncol = 4 if len(keys) > 9 else 3
    nrow = math.ceil(len(keys) / ncol)
    fig = _fig(3.7 * ncol, 2.9 * nrow + 0.8)
    axes = fig.subplots(nrow, ncol, squeeze=False, sharex=True)
    t = inp.target
    for i, key in enumerate(keys):
        ax = axes[i // ncol][i % ncol]
        for run in inp.rungs:
            s = run.series(key)
            ok = np.isfinite(s.fraction)
            if ok.any():
                x, y = _smooth(s.fraction[ok], s.value[ok])
                ax.plot(x, y, "-", color=colors[run.name], lw=1.1, alpha=0.95, label=run.name)
        compare = ""
        if t is not None:
            s = t.series(key)
            ok = np.isfinite(s.fraction)
            if ok.any():
                ax.plot(s.fraction[ok], s.value[ok], "-", color=TARGET_COLOR, lw=0.6, alpha=0.2,
                        zorder=3)
                x, y = _smooth(s.fraction[ok], s.value[ok])
                ax.plot(x, y, "-", color=TARGET_COLOR, lw=2.4, label=f"{t.name} (target)",
                        zorder=4)
                gl = float(s.fraction[ok][-1])
                tv = _at_fraction(t, key, gl)
                lv = [v for r in inp.rungs if (v := _at_fraction(r, key, gl)) is not None]
                if tv is not None and lv:
                    compare = (f"\nat {gl:.0%}: target {_fmt_health(key, tv)}, ladder "
                               f"{_fmt_health(key, min(lv))}-{_fmt_health(key, max(lv))}")
        for a in inp.alerts or []:
            if _health_alert_for(a, key):
                g = _alert_fraction(a, inp)
                if g is not None:
                    ax.axvline(g, color=SEVERITY_COLORS.get(str(a.get("severity")), "#888"),
                               lw=1.4, alpha=0.85, zorder=5)
        title, unit = HEALTH_LABELS.get(key, (key.replace("params/norm/", "param norm: "),
                                              "L2 norm"))
        ax.set_title(title + compare, loc="left", fontsize=9.5)
        ax.set_ylabel(unit, fontsize=8.5)
        if key == "grad/norm":
            _plain_log_y(ax)
        if key == "moe/drop_frac":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
        _pct_x(ax)
    for j in range(len(keys), nrow * ncol):
        axes[j // ncol][j % ncol].set_visible(False)
    for j in range(ncol):  # x labels on the lowest visible panel of each column
        col = [axes[r][j] for r in range(nrow) if (r * ncol + j) < len(keys)]
        if col:
            col[-1].set_xlabel("fraction of the run's own schedule")
            col[-1].tick_params(labelbottom=True)
    handles, labels = [], []
    for ax in axes.ravel():
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6))
    n_alerts = sum(1 for a in inp.alerts or [] if a.get("severity") in ("warn", "critical")
                   and any(_health_alert_for(a, k) for k in keys))
    who = t.name if t is not None else "the ladder"
    sup = f"Health of {who} against the ladder at the same fraction of the schedule"
    if inp.alerts is not None:
        sup += f": {n_alerts} health alert{'s' if n_alerts != 1 else ''} (vertical lines)"
    sup += (f"\nthick lines: rolling median over {SMOOTH_FRACTION:.0%} of each run; "
            "faint: every step")
    fig.suptitle(sup, x=0.01, ha="left", fontsize=12)
    return fig


# ----------------------------------------------------------------------------- ladder compare
COMPARE_A_COLOR, COMPARE_B_COLOR = "#6b6b6b", "#2b6cb0"


def _as_num(v) -> float:
    """A number of compare.json (non-finite values are the strings "NaN", "Infinity")."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@_styled
def plot_compare(metric: str, c: dict) -> Figure:
    """One metric of compare.json (fit.compare): both laws with their runs against compute,
    and the multiplier of B over A with its band, the paired per-size values and the target."""
    fig = _fig(12.5, 4.8)
    ax, axm = fig.subplots(1, 2)
    cur = c["curve"]
    x = np.array([_as_num(v) for v in cur["compute"]])
    for side, color, label in (("a", COMPARE_A_COLOR, "A"), ("b", COMPARE_B_COLOR, "B")):
        pts = c["points"][side]
        law = c["laws"][side]
        ax.plot(x, [_as_num(v) for v in cur[f"loss_{side}"]], color=color, lw=1.6,
                label=f"{label}: {law['form']} law")
        ax.scatter([_as_num(v) for v in pts["compute"]], [_as_num(v) for v in pts["loss"]],
                   color=color, s=28, zorder=3, label=f"{label}: runs' final loss")
    at = _as_num(c["at"])
    for a in (ax, axm):
        a.set_xscale("log")
        a.axvline(at, color=TARGET_COLOR, lw=0.8, ls=":")
        a.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel(_metric_label(metric))
    _plain_log_y(ax)
    ax.set_title("both recipes' laws")
    ax.legend(loc="upper right")
    m = np.array([_as_num(v) for v in cur["multiplier"]])
    lo = np.array([_as_num(v) for v in cur["lo"]])
    hi = np.array([_as_num(v) for v in cur["hi"]])
    ok = np.isfinite(m)
    axm.plot(x[ok], m[ok], color=COMPARE_B_COLOR, lw=1.6, label="laws: C_A(L_B(C)) / C")
    band = ok & np.isfinite(lo) & np.isfinite(hi)
    if band.any():
        axm.fill_between(x[band], lo[band], hi[band], color=COMPARE_B_COLOR, alpha=0.18, lw=0,
                         label=f"{c['level']:.0%} band (both fits' draws)")
    sizes = [e for e in c["per_size"] if _as_num(e.get("multiplier")) > 0]
    if sizes:
        xs = np.array([_as_num(e["compute"]) for e in sizes])
        ys = np.array([_as_num(e["multiplier"]) for e in sizes])
        elo = np.array([_as_num(e.get("lo")) for e in sizes])
        ehi = np.array([_as_num(e.get("hi")) for e in sizes])
        err = np.vstack([np.where(np.isfinite(elo), ys - elo, 0),
                         np.where(np.isfinite(ehi), ehi - ys, 0)])
        fin = np.isfinite(ys)
        axm.errorbar(xs[fin], ys[fin], yerr=err[:, fin], fmt="o", color=TARGET_COLOR, ms=5,
                     capsize=3, label="per size, paired (A's law through A's run)")
    axm.axhline(1.0, color="#999999", lw=0.8)
    mult = _as_num(c["multiplier"])
    axm.set_yscale("log")
    axm.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}x"))
    axm.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:.3g}x"))
    t = c.get("trend") or {}
    slope = _as_num(t.get("slope"))
    trend = (f"\ntrend d ln m / d ln C {slope:+.3f} [{_as_num(t.get('lo')):+.3f}, "
             f"{_as_num(t.get('hi')):+.3f}]: {t.get('verdict')}") if math.isfinite(slope) else ""
    axm.set_title(f"B over A: {mult:.3g}x [{_as_num(c['lo']):.3g}, {_as_num(c['hi']):.3g}] "
                  f"at {sci(at)}{trend}", fontsize=9.5)
    axm.set_ylabel("compute-equivalent multiplier")
    axm.legend(loc="best")
    fig.suptitle(f"ladder compare: {metric}")
    return fig


@_styled
def plot_compare_summary(doc: dict) -> Figure:
    """Every metric's multiplier at its target with its band, one row each (a forest plot)."""
    items = list(doc["metrics"].items())
    fig = _fig(8.5, 1.2 + 0.28 * len(items))
    ax = fig.subplots()
    ys = np.arange(len(items))[::-1]
    for y, (_k, c) in zip(ys, items, strict=True):
        m, lo, hi = (_as_num(c[f]) for f in ("multiplier", "lo", "hi"))
        if math.isfinite(lo) and math.isfinite(hi):
            ax.plot([lo, hi], [y, y], color=COMPARE_B_COLOR, lw=2, alpha=0.5)
        if math.isfinite(m) and m > 0:
            ax.plot([m], [y], "o", color=COMPARE_B_COLOR, ms=5)
    ax.axvline(1.0, color="#999999", lw=0.8)
    ax.set_yticks(ys, [k for k, _ in items], fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:.3g}x"))
    ax.set_xlabel("compute-equivalent multiplier of B over A at each metric's target")
    ax.set_title("ladder compare: every metric")
    return fig


def compare_figures(doc: dict) -> dict[str, bytes]:
    """compare.json's object -> {file name: PNG}: one figure per metric (compare_KEY.png, the
    key's characters outside [A-Za-z0-9._-] as '_') and, for several metrics, compare.png."""
    out = {}
    for k, c in doc["metrics"].items():
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in str(k))
        name = f"compare_{safe}.png"
        if name in out:  # two keys that differ only in replaced characters
            name = f"compare_{safe}_{len(out)}.png"
        out[name] = png_bytes(plot_compare(str(k), c))
    if len(doc["metrics"]) > 1:
        out["compare.png"] = png_bytes(plot_compare_summary(doc))
    return out
