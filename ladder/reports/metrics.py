"""Small multiples of a multi-metric pre-registration (issue 23, item 3): one panel per
registered metric (the target's curve, the frozen band, the alerts about that metric), largest
residual first (``inp.panels``, reports.inputs.metric_panels), so the domain that regressed is
seen first while the macro average may look fine. A single-metric report draws none of this.
"""

from __future__ import annotations

import math

import numpy as np

from ladder.reports.inputs import ReportInputs, alert_fraction
from ladder.reports.style import FORECAST_COLOR, SEVERITY_COLORS, TARGET_COLOR, figure, percent_x

COLUMNS = 4


def plot_metrics(inp: ReportInputs):
    """The small multiples, or None for a single-metric (or no) pre-registration."""
    ps = inp.panels
    if not ps:
        return None
    ncol = min(COLUMNS, len(ps))
    nrow = math.ceil(len(ps) / ncol)
    fig = figure(3.2 * ncol, 2.5 * nrow + 0.4)
    axes = fig.subplots(nrow, ncol, squeeze=False, sharex=True)
    for ax, p in zip(axes.flat, ps, strict=False):
        b = p.band
        if b is not None:
            ok = b.fraction > 0
            ax.fill_between(b.fraction[ok], b.lo[ok], b.hi[ok], color=FORECAST_COLOR, alpha=0.18,
                            lw=0)
            ax.plot(b.fraction[ok], b.loss[ok], "--", color=FORECAST_COLOR, lw=1.0)
        s = p.series
        if s is not None:
            ok = np.isfinite(s.fraction)
            ax.plot(s.fraction[ok], s.value[ok], "-", color=TARGET_COLOR, lw=1.4)
            lo_y = np.nanmin(s.value[ok]) if ok.any() else None
            if b is not None and lo_y is not None:  # the y range of the run, band included
                inside = (b.fraction >= np.nanmin(s.fraction[ok]) * 0.8) & np.isfinite(b.lo)
                ys = np.concatenate([s.value[ok], b.lo[inside], b.hi[inside]])
                pad = 0.05 * (np.nanmax(ys) - np.nanmin(ys) or 1e-3)
                ax.set_ylim(np.nanmin(ys) - pad, np.nanmax(ys) + pad)
        for a in p.alerts:
            g = alert_fraction(a, inp)
            if g is not None and a.get("severity") in ("warn", "critical"):
                ax.axvline(g, color=SEVERITY_COLORS[a["severity"]], lw=1.2, alpha=0.8)
        res = "no evals" if not math.isfinite(p.residual) else f"{p.residual:+.2%}"
        tone = SEVERITY_COLORS.get(p.worst or "", "#222222")
        ax.set_title(f"{_short(p.metric)}  {res}", fontsize=9, color=tone)
        ax.tick_params(labelsize=7)
        if s is None:
            ax.text(0.5, 0.5, "absent from the run" if inp.target is not None
                    else "no target run", transform=ax.transAxes, ha="center", va="center",
                    color="#666666", fontsize=8)
    for ax in list(axes.flat)[len(ps):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        percent_x(ax)
    fig.suptitle("Every registered metric: live curve (solid), frozen band, alerts "
                 "(lines); largest residual first", fontsize=10)
    return fig


def _short(key: str, width: int = 34) -> str:
    return key if len(key) <= width else "..." + key[-(width - 3):]


def panel_rows(inp: ReportInputs) -> list[dict]:
    """The panels as table rows (the page's per-metric table, in the panels' order)."""
    rows = []
    for p in inp.panels:
        fin = p.band.loss[-1] if p.band is not None else math.nan
        rows.append({"metric": p.metric,
                     "residual": "-" if not math.isfinite(p.residual) else f"{p.residual:+.2%}",
                     "worst alert": p.worst or "none",
                     "evals": 0 if p.series is None else len(p.series),
                     "forecast final": f"{fin:.4f}" if math.isfinite(fin) else "-"})
    return rows
