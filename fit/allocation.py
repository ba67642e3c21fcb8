"""Compute-optimal allocation (Chinchilla form) and IsoFLOP Approach 2.

Allocation (Hoffmann et al. 2022, Eq. 4 / App. A): minimising E + A/N^alpha + B/D^beta under
C = k N D gives N_opt(C) = G (C/k)^a, D_opt(C) = G^-1 (C/k)^b with a = beta/(alpha+beta),
b = alpha/(alpha+beta), G = (alpha A / (beta B))^(1/(alpha+beta)). k = 6 FLOPs per parameter per
token is the Chinchilla convention (the counter of this project has its own per-token FLOPs;
pass k explicitly to use it).

Approach 2 (Hoffmann et al. 2022, Sec. 3.2): for each compute budget fit a parabola of loss in
log N, take its vertex as N_opt(C), then fit log N_opt = a log C + c. A vertex outside (or in the
outer fifth of) the sampled log N range of its budget is flagged off-centre: the parabola is then
extrapolated and the optimum is not measured.
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
    a: float
    b: float
    G: float
    k: float = 6.0

    def n_opt(self, C):
        return self.G * (np.asarray(C, dtype=float) / self.k) ** self.a

    def d_opt(self, C):
        return (np.asarray(C, dtype=float) / self.k) ** self.b / self.G


def allocation(params: dict, k: float = 6.0) -> Allocation:
    al, be, A, B = params["alpha"], params["beta"], params["A"], params["B"]
    s = al + be
    G = (al * A / (be * B)) ** (1.0 / s) if al > 0 and be > 0 else math.nan
    return Allocation(a=be / s, b=al / s, G=G, k=k)


def allocation_diagnostics(params: dict, boot_u, spec, level: float) -> dict:
    al = allocation(params)
    out = {"a": al.a, "b": al.b, "G": al.G, "k": al.k,
           "formula": "N_opt = G (C/k)^a, D_opt = (C/k)^b / G, a = beta/(alpha+beta)"}
    if boot_u is not None:
        names = spec.form.names
        alpha = boot_u[:, names.index("alpha")]
        beta = boot_u[:, names.index("beta")]
        a = beta / (alpha + beta)
        q = 0.5 + level / 2
        out["a_interval"] = [float(np.quantile(a, 1 - q)), float(np.quantile(a, q))]
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
        lines = [f"IsoFLOP Approach 2: N_opt ~ C^a, a = {self.exponent:.4f} "
                 f"({self.level:.0%} interval {self.interval[0]:.4f}..{self.interval[1]:.4f}) "
                 f"from {len(self.budgets)} budgets"]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def isoflop_approach2(df: pd.DataFrame, *, budget: str = "compute", size: str = "params",
                      loss: str = "loss", bootstrap: int = 1000, level: float = 0.9,
                      seed: int = 0, min_points: int = 3) -> IsoFlopResult:
    """Approach 2 on a table with one row per run: ``budget`` (FLOPs), ``size`` (N), ``loss``.
    Budgets are grouped by value rounded to 3 significant digits. The interval comes from a
    bootstrap that resamples runs within each budget and refits everything."""
    for col in (budget, size, loss):
        if col not in df.columns:
            raise InputError("missing column", field=col)
    d = df[[budget, size, loss]].astype(float).dropna()
    d = d[(d > 0).all(axis=1)]
    key = d[budget].map(lambda c: float(f"{c:.3g}"))
    groups = [(c, g) for c, g in d.groupby(key) if len(g) >= min_points]
    if len(groups) < 2:
        raise InputError(f"needs at least 2 budgets with >= {min_points} points", field=budget)
    rows, notes = [], []
    groups = [(float(np.exp(np.log(g[budget]).mean())), g) for _, g in groups]
    for c, g in groups:
        x = np.log(g[size].to_numpy())
        y = g[loss].to_numpy()
        vx, vy, ok = _vertex(x, y)
        lo, hi = x.min(), x.max()
        span = hi - lo
        off = (not ok) or vx < lo + 0.2 * span or vx > hi - 0.2 * span
        if off:
            notes.append(f"budget {c:.3g}: optimum at N={math.exp(vx) if ok else math.nan:.3g} "
                         f"is off-centre in the sampled range {math.exp(lo):.3g}.."
                         f"{math.exp(hi):.3g}")
        rows.append({"compute": c, "n_opt": math.exp(vx) if ok else math.nan, "loss_opt": vy,
                     "n_points": len(g), "off_centre": bool(off)})
    table = pd.DataFrame(rows)
    ok = np.isfinite(table["n_opt"].to_numpy())
    a, c0 = np.polyfit(np.log(table["compute"][ok]), np.log(table["n_opt"][ok]), 1)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(bootstrap):
        xs, ys = [], []
        for c, g in groups:
            idx = rng.integers(0, len(g), len(g))
            vx, _, good = _vertex(np.log(g[size].to_numpy()[idx]), g[loss].to_numpy()[idx])
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
    return IsoFlopResult(exponent=float(a), coef=float(math.exp(c0)), interval=interval,
                         level=level, budgets=table, warnings=tuple(notes))


def _vertex(x, y):
    """Vertex of the least-squares parabola y ~ p2 x^2 + p1 x + p0 (needs p2 > 0)."""
    if len(np.unique(x)) < 3:
        return math.nan, math.nan, False
    p2, p1, p0 = np.polyfit(x, y, 2)
    if not p2 > 0:
        return math.nan, math.nan, False
    vx = -p1 / (2 * p2)
    return float(vx), float(p0 - p1 * p1 / (4 * p2)), True
