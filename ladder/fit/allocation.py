"""Compute-optimal allocation (Chinchilla form) and IsoFLOP Approach 2.

Allocation (Hoffmann et al. 2022, Eq. 4 / App. A): minimising E + A/N^alpha + B/D^beta under
C = k N D gives N_opt(C) = G (C/k)^a, D_opt(C) = G^-1 (C/k)^b with a = beta/(alpha+beta),
b = alpha/(alpha+beta), G = (alpha A / (beta B))^(1/(alpha+beta)); k = 6, Chinchilla's convention.

Approach 2 (Hoffmann et al. 2022, Sec. 3.2): each budget's parabola of loss in log N has its
vertex at N_opt(C) (flagged off-centre in the outer fifth of the sampled sizes), then
log N_opt = a log C + c.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ladder.io import InputError


@dataclass(frozen=True)
class Allocation:
    """N_opt and D_opt as powers of compute; NaN where not defined or beyond float64, and
    ``reason`` says why."""
    a: float
    b: float
    G: float
    k: float = 6.0
    reason: str | None = None

    @property
    def defined(self) -> bool:
        return self.reason is None

    def n_opt(self, C):
        return self._power(C, self.a, math.log(self.G) if self.G > 0 else math.nan)

    def d_opt(self, C):
        return self._power(C, self.b, -math.log(self.G) if self.G > 0 else math.nan)

    def _power(self, C, e, log_coef):
        # in log space: an optimum beyond float64 is NaN, never an overflow
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = np.exp(log_coef + e * np.log(np.asarray(C, dtype=float) / self.k))
        return np.where(np.isfinite(out), out, np.nan)


# exp() of more than this overflows float64 (max ~ e^709.78)
LOG_MAX = 709.0


def allocation(params: dict, k: float = 6.0) -> Allocation:
    """The compute-optimal allocation of a Chinchilla-form law, defined for alpha, beta, A,
    B > 0 (else the optimum runs off to a boundary); G in log space."""
    al, be, A, B = (float(params[n]) for n in ("alpha", "beta", "A", "B"))
    nan = math.nan
    if not all(math.isfinite(v) for v in (al, be, A, B)):
        return Allocation(nan, nan, nan, k, reason="a parameter is not finite")
    if not (al > 0 and be > 0):
        return Allocation(nan, nan, nan, k, reason=f"needs alpha > 0 and beta > 0 (alpha = "
                          f"{al:.4g}, beta = {be:.4g}): the loss does not fall in N or in D")
    if not (A > 0 and B > 0):
        return Allocation(nan, nan, nan, k, reason=f"needs A > 0 and B > 0 (A = {A:.4g}, B = "
                          f"{B:.4g})")
    s = al + be
    a, b = be / s, al / s
    log_g = (math.log(al) + math.log(A) - math.log(be) - math.log(B)) / s
    if not abs(log_g) <= LOG_MAX:
        return Allocation(a, b, nan, k, reason=f"G = exp({log_g:.4g}) overflows float64 "
                          f"(1/(alpha + beta) = {1 / s:.4g})")
    return Allocation(a, b, math.exp(log_g), k)


def allocation_diagnostics(params: dict, boot_u, spec, level: float) -> dict:
    """diagnostics.allocation of a Chinchilla fit: a, b, G (None where not defined, with why) and
    a's bootstrap interval."""
    al = allocation(params)

    def num(v):
        return float(v) if math.isfinite(v) else None
    out = {"a": num(al.a), "b": num(al.b), "G": num(al.G), "k": al.k,
           "formula": "N_opt = G (C/k)^a, D_opt = (C/k)^b / G, a = beta/(alpha+beta)"}
    if al.reason:
        out["not_defined"] = al.reason
    if boot_u is not None:
        names = spec.form.names
        alpha = boot_u[:, names.index("alpha")]
        beta = boot_u[:, names.index("beta")]
        ok = (alpha > 0) & (beta > 0)
        if ok.any():
            a = beta[ok] / (alpha[ok] + beta[ok])
            q = 0.5 + level / 2
            out["a_interval"] = [float(np.quantile(a, 1 - q)), float(np.quantile(a, q))]
            out["a_interval_draws"] = int(ok.sum())
    return out


@dataclass(frozen=True)
class IsoFlopResult:
    exponent: float                 # a in N_opt ~ C^a
    coef: float                     # N_opt = coef * C^a
    interval: tuple[float, float]   # bootstrap interval of a at `level`
    level: float
    budgets: pd.DataFrame           # per budget: compute, n_opt, loss_opt, n_points, off_centre
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def report(self) -> str:
        lines = [(f"IsoFLOP Approach 2: N_opt ~ C^a, a = {self.exponent:.4f} "
                 f"({self.level:.0%} interval {self.interval[0]:.4f}..{self.interval[1]:.4f}) "
                 f"from {len(self.budgets)} budgets")]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def isoflop_approach2(df: pd.DataFrame, *, budget: str = "compute", size: str = "params",
                      loss: str = "loss", bootstrap: int = 1000, level: float = 0.9,
                      seed: int = 0, min_points: int = 3,
                      window_octaves: float | None = 1.5) -> IsoFlopResult:
    """Approach 2 on a table of one row per run (``budget`` FLOPs, ``size`` N, ``loss``), budgets
    equal to 3 significant digits, the interval by resampling runs within each budget.
    ``window_octaves``: the parabola fitted within this many octaves of the budget's best point
    (a curve skewed in log N: on Porian et al. 2024's RefinedWeb IsoFLOPs a = 0.514 from every
    point, 0.500 from 1.5 octaves, the paper 0.497). None: all points."""
    for col in (budget, size, loss):
        if col not in df.columns:
            raise InputError("missing column", field=col)
    d = df[[budget, size, loss]].apply(pd.to_numeric, errors="coerce").astype(float)
    d = d[(np.isfinite(d) & (d > 0)).all(axis=1)]
    key = d[budget].map(lambda c: float(f"{c:.3g}"))
    groups = [(c, g) for c, g in d.groupby(key) if len(g) >= min_points]
    if len(groups) < 2:
        raise InputError(f"needs at least 2 budgets with >= {min_points} points", field=budget)
    rows, notes = [], []
    groups = [(float(np.exp(np.log(g[budget]).mean())), g) for _, g in groups]
    for c, g in groups:
        x = np.log(g[size].to_numpy())
        y = g[loss].to_numpy()
        vx, vy, ok = vertex(*window(x, y, window_octaves))
        lo, hi = x.min(), x.max()
        span = hi - lo
        off = (not ok) or vx < lo + 0.2 * span or vx > hi - 0.2 * span
        n_opt = math.exp(vx) if ok and abs(vx) <= LOG_MAX else math.nan
        if off:
            notes.append(f"budget {c:.3g}: optimum at N={n_opt:.3g} is off-centre in the "
                         f"sampled range {math.exp(lo):.3g}..{math.exp(hi):.3g}")
        rows.append({"compute": c, "n_opt": n_opt, "loss_opt": vy,
                     "n_points": len(g), "off_centre": bool(off)})
    table = pd.DataFrame(rows)
    ok = np.isfinite(table["n_opt"].to_numpy())
    if ok.sum() < 2:
        raise InputError(f"needs at least 2 budgets whose loss has a minimum in log N (a "
                         f"parabola opening upwards); {int(ok.sum())} of {len(table)} have",
                         field=size)
    a, c0 = np.polyfit(np.log(table["compute"][ok]), np.log(table["n_opt"][ok]), 1)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(bootstrap):
        xs, ys = [], []
        for c, g in groups:
            idx = rng.integers(0, len(g), len(g))
            vx, _, good = vertex(*window(np.log(g[size].to_numpy()[idx]),
                                           g[loss].to_numpy()[idx], window_octaves))
            if good:
                xs.append(math.log(c))
                ys.append(vx)
        if len(xs) >= 2:
            draws.append(np.polyfit(xs, ys, 1)[0])
    q = 0.5 + level / 2
    interval = (float(np.quantile(draws, 1 - q)), float(np.quantile(draws, q))) if draws \
        else (math.nan, math.nan)
    for n in notes:
        warnings.warn(n, stacklevel=2)
    coef = math.exp(c0) if abs(c0) <= LOG_MAX else math.nan
    return IsoFlopResult(exponent=float(a), coef=coef, interval=interval,
                         level=level, budgets=table, warnings=tuple(notes))


def window(x, y, octaves):
    """The points within ``octaves`` of the lowest loss (at least 3)."""
    if octaves is None:
        return x, y
    i = int(np.argmin(y))
    near = np.abs(x - x[i]) <= octaves * math.log(2) + 1e-12
    if len(np.unique(x[near])) < 3:
        near = np.argsort(np.abs(x - x[i]), kind="stable")[:max(3, int(near.sum()))]
    return x[near], y[near]


def vertex(x, y):
    """Vertex of the least-squares parabola y ~ p2 x^2 + p1 x + p0 (needs p2 > 0)."""
    if len(np.unique(x)) < 3:
        return math.nan, math.nan, False
    p2, p1, p0 = np.polyfit(x, y, 2)
    if not p2 > 0:
        return math.nan, math.nan, False
    vx = -p1 / (2 * p2)
    return float(vx), float(p0 - p1 * p1 / (4 * p2)), True
