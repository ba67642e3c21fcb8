"""The report's figures: each returns a matplotlib ``Figure`` (None when its artifacts are
missing) and only draws; ``plot_ladder``, ``plot_law`` and ``plot_watch`` draw what
:mod:`reports.figdata` computes. ``matplotlib.figure.Figure`` without pyplot: no display backend
(PNG through Agg)."""

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
from matplotlib.ticker import (FixedLocator, FuncFormatter, LogLocator, MaxNLocator,
                               NullFormatter, NullLocator)

from ladder.predict.watch import SEVERITIES
from ladder.reports.figdata import TRAIN_KEY, health_alert_for, ladder_data, law_data, watch_data
from ladder.reports.inputs import ReportInputs, RunData
from ladder.reports.inputs import alert_fraction as _alert_fraction
from ladder.reports.style import (FORECAST_COLOR, LAW_COLOR, NOT_APPLICABLE_COLOR, RC,
                                  SEVERITY_COLORS, TARGET_COLOR, TRAIN_COLOR, UPDATED_COLOR,
                                  rung_colors, sci, si)
from ladder.reports.style import figure as _fig
from ladder.reports.style import loss_fmt as num
from ladder.reports.style import percent_x as _pct_x

HEALTH_LABELS = {  # the health figure's panels, in this order: (title, unit)
    "moe/drop_frac": ("token-drop fraction", "fraction of assignments dropped"),
    "grad/norm": ("gradient norm", "global L2 norm"),
    "moe/router_entropy": ("router entropy", "nats"),
    "params/norm/router_bias": ("router-bias norm (rule-set, not trained)", "L2 norm"),
    "moe/load_max_over_mean": ("expert load imbalance", "max load / mean load"),
}


def png_bytes(fig) -> bytes:
    """``fig`` as PNG bytes on a white background (the report's files and the live page)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()


def _styled(func):
    """Apply the report's rcParams while a figure is built (axes read them when created)."""
    @functools.wraps(func)
    def wrapper(*args, **kw):
        with rc_context(RC):
            return func(*args, **kw)
    return wrapper


def _plain_log_y(ax) -> None:
    """Log y axis labelled with plain numbers (2.1, 2.5, 3, not 10^0.3); within a decade, round
    linear ticks (log locators give two or three there). Call after the limits are settled."""
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


@_styled
def plot_ladder(inp: ReportInputs) -> Figure | None:
    """The ladder figure of ``inp`` (its data: ladder.reports.figdata.ladder_data)."""
    d = ladder_data(inp)
    return None if d is None else draw_ladder(d, colors_for(inp))


def _draw_rung(ax, r, color: str, join: bool) -> None:
    label = f"{r.name}  ({si(r.active_params)} active, {sci(r.compute, 2)} FLOPs)"
    if r.status != "complete":
        label += f"  [{r.status}]"
    ax.plot(r.tokens, r.value, "o", color=color, ms=4.5, mec="white", mew=0.5, label=label,
            zorder=3)
    if join:  # no law curve per run: join the points instead
        ax.plot(r.tokens, r.value, "-", color=color, lw=0.8, alpha=0.6, zorder=2)
    if r.final is not None:
        ax.plot([r.final[0]], [r.final[1]], "o", color=color, ms=8, mec=TARGET_COLOR, mew=1,
                zorder=4)
    if r.law is not None:  # no band: the rungs overlap, their bands would hide the points
        ax.plot(r.law.x, r.law.loss, "-", color=color, lw=1.6, alpha=0.9, zorder=2)


def _ladder_title(d) -> str:
    res = d.residuals
    if len(res):
        pts = "eval points" if d.whole else "final points"
        return (f"The law tracks the ladder: median |error| {np.median(np.abs(res)):.2%}, max "
                f"{np.abs(res).max():.2%} over {len(res)} {pts} of {len(d.rungs)} rungs")
    if d.law_form is None:
        return (f"Ladder: {len(d.rungs)} rungs, last {d.metric} {num(max(d.last_values))} -> "
                f"{num(min(d.last_values))} (no law given)")
    return f"Ladder: {len(d.rungs)} rungs; the law could not be evaluated along them"


def draw_ladder(d, colors: dict[str, str]) -> Figure:
    """Each rung's evals against tokens with the law (ladder.reports.figdata.LadderData)."""
    fig = _fig(9.5, 5.6)
    ax = fig.add_subplot()
    for r in d.rungs:
        _draw_rung(ax, r, colors[r.name], d.join)
    line = d.law_line
    if line is not None:
        ax.plot(line.x, line.loss, "-", color=LAW_COLOR, lw=1.8, zorder=2)
        if np.isfinite(line.lo).any():
            ax.fill_between(line.x, line.lo, line.hi, color=LAW_COLOR, alpha=0.12, lw=0)
    if d.target is not None:
        t = d.target
        ax.plot(t.tokens, t.value, "s", color=TARGET_COLOR, ms=4.5,
                label=f"{t.name} (target; {si(t.active_params)} active)", zorder=4)
    fc = d.forecast
    if fc is not None:
        ax.plot(fc.x, fc.loss, "--", color=TARGET_COLOR, lw=1.2,
                label=f"target: pre-registered forecast (shaded: {d.level:.0%} band)", zorder=2)
        ax.fill_between(fc.x, fc.lo, fc.hi, color=TARGET_COLOR, alpha=0.08, lw=0)
    ax.set_xscale("log")
    _si_x(ax)
    if d.ylim is not None:
        ax.set_ylim(*d.ylim)
    _plain_log_y(ax)
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel(_metric_label(d.metric))
    handles, labels = ax.get_legend_handles_labels()
    if d.drew_law:
        what = "along each run" if d.whole else "through the final points (large dots)"
        handles.append(Line2D([], [], color="#555555" if d.whole else LAW_COLOR, lw=1.6))
        band = ""
        if not d.whole:
            band = (f", shaded: {d.level:.0%} band"
                    if line is not None and np.isfinite(line.lo).any()
                    else "; band missing (could not be computed)")
        labels.append(f"law ({d.law_form}) {what}{band}")
    ax.legend(handles, labels, loc="upper right")
    ax.set_title(_ladder_title(d), loc="left")
    return fig


# ----------------------------------------------------------------------------- 2. the law


@_styled
def plot_law(inp: ReportInputs) -> Figure | None:
    """The law figure of ``inp`` (its data: ladder.reports.figdata.law_data)."""
    d = law_data(inp)
    return None if d is None else draw_law(d, colors_for(inp))


def _draw_law_points(ax, d, colors: dict[str, str]) -> None:
    """The law at the end of a run, the rungs' finals (or the fitted points), the target."""
    sub = d.subtract
    c = d.curve
    if c is not None:
        ax.plot(c.x, c.loss - sub, "-", color=LAW_COLOR, lw=2,
                label=f"law ({d.form}) at the end of a run")
        if np.isfinite(c.lo).any():
            lo = np.where(c.lo - sub > 0, c.lo - sub, np.nan)
            ax.fill_between(c.x, lo, c.hi - sub, color=LAW_COLOR, alpha=0.15, lw=0,
                            label=f"{d.curve_level:.0%} prediction band")
        else:
            ax.plot([], [], " ", label="band: could not be computed (missing, not zero)")
    for name, compute, v in d.finals:
        ax.plot(compute, v - sub, "o", color=colors[name], ms=8, mec="white", mew=0.8,
                zorder=4, label=f"{name}: {num(v)}")
    if len(d.table):
        n = len(d.table)
        ax.plot(d.table[:, 0], d.table[:, 1] - sub, "o", color="#495057",
                ms=5 if n > 50 else 7, alpha=0.7, mec="white", mew=0.5, zorder=4,
                label=f"fitted points: the last of each of {n} run{'s' if n != 1 else ''} "
                      f"(from {d.table_from})")
    fc, tcomp = d.forecast_final, d.target_compute
    if fc and tcomp is not None:
        f, lo, hi = (fc.get(k) for k in ("loss", "lo", "hi"))
        if isinstance(f, (int, float)):
            band = isinstance(lo, (int, float)) and isinstance(hi, (int, float))
            yerr = [[f - lo], [hi - f]] if band else None
            ax.errorbar([tcomp], [f - sub], yerr=yerr, fmt="D", color=TARGET_COLOR, ms=8,
                        capsize=6, lw=2, zorder=5,
                        label=f"{d.target_name or 'target'} forecast: {num(f)} "
                              f"[{num(lo)}, {num(hi)}]")
    if d.actual is not None:
        ax.plot([tcomp], [d.actual[1] - sub], "*", color="#e8590c", ms=15, mec=TARGET_COLOR,
                mew=0.8, zorder=6, label=f"{d.actual[0]} actual: {num(d.actual[1])}")


def _law_title(d) -> str:
    fc, tcomp = d.forecast_final, d.target_compute
    if fc and isinstance(fc.get("loss"), (int, float)) and d.finals and tcomp is not None:
        ratio = tcomp / max(c for _, c, _ in d.finals)
        # the axis plots loss - E when the law has an asymptote: say what the diamond reads
        # there, so the title's loss and the point on the axis agree
        on_axis = (f" (on this axis, loss - E: {num(fc['loss'] - d.subtract)})"
                   if d.subtract else "")
        return (f"Forecast for {d.target_name or 'the target'}: loss {num(fc['loss'])} "
                f"[{num(fc.get('lo'))}, {num(fc.get('hi'))}]{on_axis}, "
                f"{ratio:.3g}x the largest rung's compute")
    if d.form is not None and not d.finals and len(d.table):
        return f"The {d.form} law through the {len(d.table)} runs it was fitted to"
    if d.form is not None:
        return f"The {d.form} law through {len(d.finals)} finished rungs"
    return f"{len(d.finals)} finished rungs (no law given)"


def _draw_backtests(axb, d) -> None:
    rows = d.backtests
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
        if d.form is not None:
            why = "no backtest errors in law.json"
            if d.backtests_skipped:
                why += f"\n({d.backtests_skipped} folds skipped:\ntoo few runs for the form)"
        _note(axb, why)
        axb.set_title("Backtests", loc="left")
    if d.notes:
        axb.text(0.02, 0.02, "\n".join(d.notes),
                 transform=axb.transAxes, fontsize=7.5, va="bottom", color="#444444",
                 bbox={"facecolor": "white", "edgecolor": "#dddddd", "alpha": 0.9})


def draw_law(d, colors: dict[str, str]) -> Figure:
    """The law against compute with the target's forecast, and the backtests
    (ladder.reports.figdata.LawData)."""
    fig = _fig(12.5, 5.4)
    gs = fig.add_gridspec(1, 2, width_ratios=[2.3, 1])
    ax, axb = fig.add_subplot(gs[0]), fig.add_subplot(gs[1])
    _draw_law_points(ax, d, colors)
    ax.set_xscale("log")
    _plain_log_y(ax)
    ax.set_xlabel("training compute C (FLOPs, no LM head)")
    ax.set_ylabel(f"{d.metric} - E  (E = {num(d.E)})" if d.subtract else
                  _metric_label(d.metric))
    if ax.get_legend_handles_labels()[0]:  # an old law.json without points has nothing to name
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    if d.expression:
        expr = textwrap.fill(f"law: {d.expression}", 110)
        ax.set_title(expr, loc="left", fontsize=8, color="#555555", fontweight="normal")
    fig.suptitle(_law_title(d), x=0.01, ha="left", fontsize=12)
    if d.error:
        ax.text(0.02, 0.98, "fitted line unavailable:\n" + d.error[:120], transform=ax.transAxes,
                va="top", fontsize=8, color="#a61e4d")
    _draw_backtests(axb, d)
    return fig


# ----------------------------------------------------------------------------- 3. the watch


@_styled
def plot_watch(inp: ReportInputs, updated=None) -> Figure | None:
    """The watch figure of ``inp`` (its data: ladder.reports.figdata.watch_data), with the
    ``updated`` forecast ahead when given (a ``figdata.Curve``: the live page's)."""
    d = watch_data(inp, updated)
    return None if d is None else draw_watch(d)


def _draw_band(ax, axr, d) -> None:
    fc = d.forecast
    if fc is None:
        axr.text(0.5, 0.5, "no pre-registration given: no forecast to compare with",
                 transform=axr.transAxes, ha="center", va="center", color="#666666")
        axr.set_yticks([])
        return
    ax.fill_between(fc.x, fc.lo, fc.hi, color=FORECAST_COLOR, alpha=0.18, lw=0,
                    label=f"pre-registered {d.level:.0%} band")
    ax.plot(fc.x, fc.loss, "--", color=FORECAST_COLOR, lw=1.4, label="pre-registered forecast")
    axr.fill_between(fc.x, d.rel_lo, d.rel_hi, color=FORECAST_COLOR, alpha=0.18, lw=0)
    axr.axhline(0, color=FORECAST_COLOR, ls="--", lw=1.2)
    if d.band_missing:
        ax.text(0.5, 0.02, "band missing in prereg (could not be computed)",
                transform=ax.transAxes, ha="center", color="#a61e4d")


def _draw_run(ax, axr, d) -> None:
    if d.train is not None:  # noisier than the evals, may sit off-scale: clipped, never scaled to
        ax.plot(d.train.fraction, d.train.value, "-", color=TRAIN_COLOR, lw=0.8, alpha=0.8,
                zorder=1.5, scalex=False, scaley=False, label=f"train loss ({TRAIN_KEY})")
    if d.run_label is None:
        ax.text(0.5, 0.9, d.run_note, transform=ax.transAxes, ha="center", color="#666666")
        return
    ax.plot(d.fraction, d.value, "-o", color=TARGET_COLOR, lw=2, ms=3.5, label=d.run_label,
            zorder=4)
    if d.deviation is not None:
        axr.plot(d.fraction, d.deviation, "-o", color=TARGET_COLOR, lw=2, ms=3.5, zorder=4)
    for g in d.nonfinite:
        ax.axvline(g, color=SEVERITY_COLORS["critical"], lw=2, ls=":")
    u = d.updated
    if u is not None:  # issue 40: labelled, beside the registered band it never replaces
        ax.plot(u.x, u.loss, "-", color=UPDATED_COLOR, lw=1.5, zorder=3,
                label="updated forecast (from the run's evals so far)")
        ax.fill_between(u.x, u.lo, u.hi, color=UPDATED_COLOR, alpha=0.12, lw=0)


def _draw_alerts(ax, axr, d) -> None:
    """Loss alerts: vertical lines through both panels, labelled with their kind; every other
    alert: a triangle on the top edge (drawn in full on the health figure)."""
    for g0, g1 in d.spans:
        for a in (ax, axr):
            a.axvspan(g0, g1, color=NOT_APPLICABLE_COLOR, alpha=0.35, hatch="//", lw=0, zorder=0)
    for a in d.loss_alerts:
        c = SEVERITY_COLORS.get(a.severity, SEVERITY_COLORS["info"])
        for axx in (ax, axr):
            axx.axvline(a.fraction, color=c, lw=1.6 if a.severity != "info" else 0.8,
                        alpha=0.85, zorder=1)
        if a.value is not None:
            ax.plot([a.fraction], [a.value], "o", ms=11, mfc="none", mec=c, mew=2, zorder=5)
        if a.labelled:
            ax.text(a.fraction, 0.985, f" {a.kind} ({a.severity})",
                    transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="left",
                    fontsize=7.5, color=c)
    for g, sev in d.ticks:
        ax.plot([g], [1.0], "v", ms=7, color=SEVERITY_COLORS.get(sev, SEVERITY_COLORS["info"]),
                transform=ax.get_xaxis_transform(), clip_on=False, zorder=6, mec="white",
                mew=0.5)


def _watch_legend(fig, ax, d) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if d.band_missing:
        keep = [i for i, lab in enumerate(labels) if "band" not in lab]
        handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
    lines = {a.severity for a in d.loss_alerts}
    ticks = {sev for _, sev in d.ticks}
    for sev in SEVERITIES:
        if sev in lines:
            handles.append(Line2D([], [], color=SEVERITY_COLORS[sev], lw=1.5))
            labels.append(f"{sev}: loss alert")
        if sev in ticks:
            handles.append(Line2D([], [], color=SEVERITY_COLORS[sev], marker="v", ls=""))
            labels.append(f"{sev}: other alert (health, spikes)")
    if d.spans:
        handles.append(Patch(facecolor=NOT_APPLICABLE_COLOR, alpha=0.35, hatch="//"))
        labels.append("forecast does not apply")
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(handles)))


def _watch_title(d) -> str:
    v, name, lvl = d.verdict, d.name, f"{d.level:.0%}"
    where = ("final" if v.get("complete") else f"at {v['fraction']:.0%} of the run") \
        if v else ""
    if "not_applicable_since" in v:
        title = (f"{name} {where}: {num(v['actual'])} vs forecast {num(v['forecast'])}; the "
                 f"forecast no longer applies since {v['not_applicable_since']:.0%}: not judged")
    elif "inside" in v:
        state = "inside" if v["inside"] else ("ABOVE" if v["actual"] > v["hi"] else "BELOW")
        title = (f"{name} {where}: {num(v['actual'])} vs forecast {num(v['forecast'])} "
                 f"[{num(v['lo'])}, {num(v['hi'])}] -> {state} the {lvl} band")
    elif v.get("band_missing"):
        title = (f"{name} {where}: {num(v['actual'])} vs forecast {num(v['forecast'])} "
                 f"({v['actual'] / v['forecast'] - 1:+.1%}); band missing, cannot judge")
    elif d.forecast is None:
        title = f"{name}: no pre-registered forecast to compare with"
    else:
        title = f"{name}: pre-registered forecast, no live points yet"
    n_bad = d.counts.get("warn", 0) + d.counts.get("critical", 0)
    if d.has_alerts:
        title += f"; {n_bad} warning/critical alert{'s' if n_bad != 1 else ''}"
    return title


def draw_watch(d) -> Figure:
    """The target's curve over its registered band, the alerts, and the deviation from the
    forecast (ladder.reports.figdata.WatchData)."""
    fig = _fig(11, 7.2)
    gs = fig.add_gridspec(2, 1, height_ratios=[2.2, 1], hspace=0.05)
    ax = fig.add_subplot(gs[0])
    axr = fig.add_subplot(gs[1], sharex=ax)
    _draw_band(ax, axr, d)
    _draw_run(ax, axr, d)
    _draw_alerts(ax, axr, d)
    ax.set_ylabel(_metric_label(d.metric))
    axr.set_ylabel("actual / forecast - 1 (%)")
    axr.set_xlabel("fraction of the target's planned run")
    _pct_x(axr)
    ax.tick_params(labelbottom=False)
    ax.set_xlim(0, 1.0)
    if d.ylim is not None:
        ax.set_ylim(*d.ylim)
    if d.rlim is not None:
        axr.set_ylim(*d.rlim)
    if d.tokens_total is not None:
        total = d.tokens_total
        sec = ax.secondary_xaxis("top", functions=(lambda g: g * total, lambda x: x / total))
        _si_x(sec)
        sec.set_xlabel("tokens seen")
    _watch_legend(fig, ax, d)
    fig.suptitle(textwrap.fill(_watch_title(d), 110), x=0.01, ha="left", fontsize=12)
    return fig


# ----------------------------------------------------------------------------- 4. health


def health_keys(inp: ReportInputs) -> list[str]:
    present: set[str] = set()
    for r in list(inp.rungs) + ([inp.target] if inp.target is not None else []):
        present |= r.keys()
    keys = [k for k in HEALTH_LABELS if k in present]
    keys += sorted(k for k in present if k.startswith("params/norm/") and k not in keys)
    return keys


SMOOTH_FRACTION = 0.02  # health lines: rolling median over 2% of each run's own schedule


def _smooth(x: np.ndarray, y: np.ndarray, width: float = SMOOTH_FRACTION):
    """Centred rolling median over ``width`` of the run (x in fractions: runs of 60 and 20,000
    steps read alike), at no more than ~400 x positions."""
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
    axes = fig.subplots(nrow, ncol, squeeze=False, sharex=True).ravel()
    t = inp.target
    for ax, key in zip(axes, keys, strict=False):
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
            if health_alert_for(a, key):
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
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    for ax in axes[max(0, len(keys) - ncol):len(keys)]:  # the lowest visible panel of each column
        ax.set_xlabel("fraction of the run's own schedule")
        ax.tick_params(labelbottom=True)
    legend: dict = {}  # label -> the first handle of that label
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(lab, h)
    fig.legend(list(legend.values()), list(legend), loc="outside lower center",
               ncol=min(len(legend), 6))
    n_alerts = sum(1 for a in inp.alerts or [] if a.get("severity") in ("warn", "critical")
                   and any(health_alert_for(a, k) for k in keys))
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


def _nums(vs) -> np.ndarray:
    return np.array([_as_num(v) for v in vs])


@_styled
def plot_compare(metric: str, c: dict) -> Figure:
    """One metric of compare.json (ladder.fit.compare): both laws with their runs against compute,
    and the multiplier of B over A with its band, the paired per-size values and the target."""
    fig = _fig(12.5, 4.8)
    ax, axm = fig.subplots(1, 2)
    cur = c["curve"]
    x = _nums(cur["compute"])
    for side, color, label in (("a", COMPARE_A_COLOR, "A"), ("b", COMPARE_B_COLOR, "B")):
        pts = c["points"][side]
        law = c["laws"][side]
        ax.plot(x, _nums(cur[f"loss_{side}"]), color=color, lw=1.6,
                label=f"{label}: {law['form']} law")
        ax.scatter(_nums(pts["compute"]), _nums(pts["loss"]),
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
    m, lo, hi = (_nums(cur[k]) for k in ("multiplier", "lo", "hi"))
    ok = np.isfinite(m)
    axm.plot(x[ok], m[ok], color=COMPARE_B_COLOR, lw=1.6, label="laws: C_A(L_B(C)) / C")
    band = ok & np.isfinite(lo) & np.isfinite(hi)
    if band.any():
        axm.fill_between(x[band], lo[band], hi[band], color=COMPARE_B_COLOR, alpha=0.18, lw=0,
                         label=f"{c['level']:.0%} band (both fits' draws)")
    sizes = [e for e in c["per_size"] if _as_num(e.get("multiplier")) > 0]
    if sizes:
        xs, ys, elo, ehi = (_nums([e.get(k) for e in sizes])
                            for k in ("compute", "multiplier", "lo", "hi"))
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
    """compare.json's object -> {file name: PNG}: compare_KEY.png per metric (characters outside
    [A-Za-z0-9._-] as '_') and, for several metrics, compare.png."""
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
