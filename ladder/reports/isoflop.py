"""The IsoFLOP figure of `ladder isoflop --plot FILE`: a pure function of a
:class:`ladder.fit.isoflop.IsoflopResult`.

Left: loss against N, one colour per compute budget, with each budget's Approach-2 parabola
(over the window it was fitted on) and its vertex N*(C). Right: N*(C) and D*(C) on log axes,
the optima of both approaches, the fitted power laws with their bootstrap bands, and the budget
asked about.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps, rc_context
from matplotlib.figure import Figure

from ladder.fit.isoflop import WINDOW_OCTAVES, budget_key, window
from ladder.reports.style import RC


def _band(law, grid, level):
    if not len(law.draws):
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # a draw beyond float64 draws no band
        vals = np.exp(law.draws[:, 1][:, None] + law.draws[:, 0][:, None] * np.log(grid)[None])
    vals = np.where(np.isfinite(vals), vals, np.nan)
    q = 0.5 + level / 2
    return np.quantile(vals, 1 - q, axis=0), np.quantile(vals, q, axis=0)


def plot_isoflop(res, budget: float | None = None) -> Figure:
    with rc_context(RC):
        fig = Figure(figsize=(13, 5.4), layout="constrained")
        ax, axo = fig.subplots(1, 2)
        d = res.points[res.points["final"]]
        key = budget_key(d["compute"].to_numpy())
        budgets = sorted(set(key))
        cmap = colormaps["viridis"]
        colors = {b: cmap(0.9 * i / max(len(budgets) - 1, 1)) for i, b in enumerate(budgets)}
        opt2 = res.approach2.optima if res.approach2 is not None else None
        for b in budgets:
            g = d[key == b]
            x, y = np.log(g["params"].to_numpy()), g["loss"].to_numpy()
            ax.plot(np.exp(x), y, "o", ms=4, color=colors[b], alpha=0.8)
            if opt2 is not None and len(np.unique(x)) >= 3:
                wx, wy = window(x, y, WINDOW_OCTAVES)
                if len(np.unique(wx)) >= 3:
                    p = np.polyfit(wx, wy, 2)
                    xx = np.linspace(wx.min(), wx.max(), 60)
                    ax.plot(np.exp(xx), np.polyval(p, xx), "-", color=colors[b], lw=1.2)
        if opt2 is not None:
            ok = np.isfinite(opt2["n_opt"])
            ax.plot(opt2["n_opt"][ok], opt2["loss_opt"][ok], "*", color="#d62728", ms=9,
                    zorder=5, label="approach 2: each budget's parabola vertex N*")
            off = ok & opt2["off_centre"].to_numpy(bool)
            if off.any():
                ax.plot(opt2["n_opt"][off], opt2["loss_opt"][off], "o", mfc="none",
                        mec="#d62728", ms=12, label="off-centre (extrapolated)")
        ax.set_xscale("log")
        ax.set_xlabel("parameters N")
        ax.set_ylabel("loss")
        lo_c, hi_c = min(budgets), max(budgets)
        ax.set_title(f"IsoFLOP profiles: {len(budgets)} budgets\n{lo_c:.3g} to {hi_c:.3g} "
                     f"FLOPs (colour: budget)", loc="left")
        if opt2 is not None:
            ax.legend(loc="upper right")

        m = res.main
        cs = np.concatenate([m.optima["compute"].to_numpy(), [budget] if budget else []])
        grid = np.geomspace(cs.min() / 1.5, cs.max() * 1.5, 100)
        for law, col, name, key_opt in ((m.n, "#2b6cb0", "N*", "n_opt"),
                                        (m.d, "#e8590c", "D*", "d_opt")):
            if math.isfinite(law.exponent):
                axo.plot(grid, law.coef * grid ** law.exponent, "-", color=col, lw=1.8,
                         label=f"{name} ~ C^{law.exponent:.3f} [{law.exponent_interval[0]:.3f}, "
                               f"{law.exponent_interval[1]:.3f}] ({m.name})")
                band = _band(law, grid, res.level)
                if band is not None:
                    axo.fill_between(grid, band[0], band[1], color=col, alpha=0.15, lw=0)
            axo.plot(m.optima["compute"], m.optima[key_opt], "o", color=col, ms=5)
            other = res.approach1 if m is res.approach2 else None
            if other is not None:
                axo.plot(other.optima["compute"], other.optima[key_opt], "x", color=col, ms=5,
                         alpha=0.7, label=f"{name}: approach 1 (best run per budget)")
            if budget:
                v, (a, b) = law.at(budget, res.level)
                if math.isfinite(v):
                    axo.errorbar([budget], [v], yerr=[[max(v - a, 0)], [max(b - v, 0)]]
                                 if math.isfinite(a) else None, fmt="D", color=col, ms=7,
                                 capsize=5, zorder=6)
                    axo.annotate(f"{name} = {v:.3g}", (budget, v), textcoords="offset points",
                                 xytext=(-8, 8), ha="right", fontsize=9, color=col)
        axo.set_xscale("log")
        axo.set_yscale("log")
        axo.set_xlabel("compute C (FLOPs)")
        axo.set_ylabel("compute-optimal N* (parameters), D* (tokens)")
        axo.set_title(f"Compute-optimal allocation\n({res.level:.0%} run-level bootstrap "
                      f"bands)", loc="left")
        axo.legend(loc="upper left")
        return fig


__all__ = ["plot_isoflop"]
