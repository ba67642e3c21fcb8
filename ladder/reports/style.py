"""Colours, number formats and figure defaults shared by every plot, so a rung has one colour
everywhere and the pages read alike."""

from __future__ import annotations

import math

from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

TARGET_COLOR = "#111111"      # the target (proxy hero) is black and thick in every plot
FORECAST_COLOR = "#2b6cb0"    # the pre-registered forecast and its band
LAW_COLOR = "#2b6cb0"
SEVERITY_COLORS = {"info": "#8a8a8a", "warn": "#f08c00", "critical": "#d62728"}
NOT_APPLICABLE_COLOR = "#b0b0b0"
UPDATED_COLOR = "#1971c2"     # the watcher's updated forecast (issue 40), beside the frozen band
TRAIN_COLOR = "#adb5bd"       # the run's train loss: neutral and faint, beneath the metric

RC = {
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "font.size": 10,
    "axes.titlesize": 11.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.6,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "figure.titlesize": 13,
    "figure.titleweight": "bold",
}


def rung_colors(names: list[str]) -> dict[str, str]:
    """One colour per rung, ordered small -> large along viridis (dark = small, green = large);
    the yellow end is left out because it is unreadable on white."""
    cmap = colormaps["viridis"]
    n = len(names)
    return {name: to_hex(cmap(0.05 + 0.75 * (i / max(n - 1, 1)))) for i, name in enumerate(names)}


def si(x: float | None, digits: int = 3) -> str:
    """1.6e9 -> '1.6B', 6.1e7 -> '61M', 48e9 -> '48B' (parameters and tokens)."""
    if x is None or not math.isfinite(x):
        return "?"
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.{digits}g}{suf}"
    return f"{x:.{digits}g}"


def sci(x: float | None, digits: int = 3) -> str:
    """FLOPs: 2.611e24 -> '2.61e24'."""
    if x is None or not math.isfinite(x):
        return "?"
    m, e = f"{x:.{digits - 1}e}".split("e")
    return f"{m}e{int(e)}"


def num(x: float | None, digits: int = 4) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}"


def loss_fmt(x: float | None) -> str:
    """Losses with three decimals (2.490, not 2.49): forecast, band and actual line up."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "n/a"
    return f"{x:.3f}"


def pct(x: float | None, digits: int = 2) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    v = round(100 * x, digits)
    return f"{v + 0.0:+.{digits}f}%"  # + 0.0 turns -0.0 into 0.0 (no "-0.00%")


def figure(w: float, h: float) -> Figure:
    """A ``w`` x ``h`` inch figure laid out by matplotlib's constrained layout (every page's)."""
    return Figure(figsize=(w, h), layout="constrained")


def percent_x(ax) -> None:
    """The x axis in percent (a fraction of the run)."""
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
