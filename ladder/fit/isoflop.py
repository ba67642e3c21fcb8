"""IsoFLOP planning: the compute-optimal model size N* and data D* as power laws of compute
(`ladder isoflop`), by Approaches 1 and 2 of Hoffmann et al. 2022 (Sec. 3.1, 3.2).

Input: a points table (``compute``, ``loss`` and ``params`` or ``tokens``, the other from C = 6 N
D, which IsoFLOP tables such as Porian et al. 2024's follow) or runs directories' points.

- **Approach 2** (IsoFLOP profiles): a budget's runs (compute equal to 3 significant digits, at
  least 3 sizes) give a parabola of loss in log N (log D), fitted within 1.5 octaves of its best
  point (:func:`window`: the profile is skewed); its vertex is N*(C) (D*(C)), flagged
  off-centre in the outer fifth of the sizes. Then power laws in C by least squares.
- **Approach 1** (the envelope): the run of lowest loss at each C, along the runs' curves on a
  grid of 40 C where two runs overlap, or each budget's best run of an IsoFLOP table.

Bands (quantiles at ``level``), everything refitted: Approach 2 by a residual bootstrap within
each budget (resampling its runs drops sizes: 6x the authors' interval on Porian et al.'s
RefinedWeb profiles); Approach 1 by resampling the budgets' best runs (or the runs, on curves).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ladder.fit.allocation import LOG_MAX
from ladder.fit.solver import percentile_interval
from ladder.io import EX_DATAERR, InputError

SCHEMA = "isoflop/1"
FLOPS_PER_PARAM_TOKEN = 6.0  # C = 6 N D (Hoffmann et al. 2022, Kaplan et al. 2020)
GRID = 40                    # Approach 1 on curves: compute values of the envelope
# the Approach 2 parabola's window: on Porian et al. 2024's RefinedWeb IsoFLOPs a = 0.514 from
# every point, 0.500 from 1.5 octaves, the paper 0.497
WINDOW_OCTAVES = 1.5


def _exp(x: float) -> float:
    """exp(x), NaN where it is not finite or leaves float64 (a flat parabola's vertex can sit
    hundreds of e-folds away)."""
    return math.exp(x) if math.isfinite(x) and abs(x) <= LOG_MAX else math.nan


@dataclass(frozen=True)
class PowerLaw:
    """``y = coef * C ** exponent`` with bootstrap intervals (NaN when not computable)."""

    exponent: float
    coef: float
    exponent_interval: tuple[float, float]
    draws: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 2)))

    def at(self, compute: float, level: float) -> tuple[float, tuple[float, float]]:
        """The value at ``compute`` and its bootstrap interval."""
        if not compute > 0:
            return math.nan, (math.nan, math.nan)
        # in log space: coef * C^a beyond float64 is not defined (NaN), never an OverflowError
        v = _exp(math.log(self.coef) + self.exponent * math.log(compute)) \
            if self.coef > 0 else math.nan
        if not len(self.draws):
            return v, (math.nan, math.nan)
        with np.errstate(over="ignore", invalid="ignore"):
            vals = np.exp(self.draws[:, 1] + self.draws[:, 0] * math.log(compute))
        lo, hi = percentile_interval(np.where(np.isfinite(vals), vals, np.nan), level)
        return v, (float(lo), float(hi))


@dataclass(frozen=True)
class Approach:
    """One approach's optima per budget and its two power laws."""

    name: str
    optima: pd.DataFrame        # compute, n_opt, d_opt, loss_opt, n_points, off_centre
    n: PowerLaw
    d: PowerLaw

    def to_json(self, level: float, budget: float | None = None) -> dict:
        out = {"n_exponent": self.n.exponent, "d_exponent": self.d.exponent,
               "n_coef": self.n.coef, "d_coef": self.d.coef,
               "n_exponent_interval": list(self.n.exponent_interval),
               "d_exponent_interval": list(self.d.exponent_interval),
               "optima": [{k: (bool(v) if k == "off_centre" else
                               int(v) if k == "n_points" else float(v))
                           for k, v in r.items()} for r in self.optima.to_dict("records")]}
        if budget is not None:
            n, n_iv = self.n.at(budget, level)
            d, d_iv = self.d.at(budget, level)
            out.update(n_opt=n, d_opt=d, n_opt_interval=list(n_iv), d_opt_interval=list(d_iv))
        return out


@dataclass(frozen=True)
class IsoflopResult:
    approach1: Approach
    approach2: Approach | None
    level: float
    bootstrap: int
    points: pd.DataFrame        # the table used: run, params, tokens, compute, loss, final
    derived: str | None         # "params" or "tokens" when one came from C = 6 N D
    warnings: tuple[str, ...] = ()

    @property
    def main(self) -> Approach:
        """Approach 2 when the table has IsoFLOP profiles, else Approach 1."""
        return self.approach2 if self.approach2 is not None else self.approach1

    @property
    def convention(self) -> str:
        return f"C = {FLOPS_PER_PARAM_TOKEN:g} N D" + (
            f" ({self.derived} derived from it)" if self.derived else "")

    def to_json(self, budget: float | None = None) -> dict:
        """The `ladder isoflop --json` object; a value that cannot be computed is NaN (written
        as the string "NaN" by ladder.io.to_jsonable, as in every JSON ladder writes)."""
        a1 = self.approach1.to_json(self.level, budget)
        a2 = None if self.approach2 is None else self.approach2.to_json(self.level, budget)
        main = a1 if a2 is None else a2         # its numbers are repeated at the top level
        out = {"schema": SCHEMA, "approach": self.main.name, "level": self.level,
               **{k: main[k] for k in ("n_exponent", "d_exponent", "n_exponent_interval",
                                       "d_exponent_interval", "n_coef", "d_coef")},
               "convention": self.convention,
               "bootstrap": self.bootstrap, "runs": int(self.points["run"].nunique()),
               "approach1": a1, "approach2": a2, "warnings": list(self.warnings)}
        if budget is not None:
            out["budget"] = float(budget)
            out.update({k: main[k] for k in ("n_opt", "d_opt", "n_opt_interval",
                                             "d_opt_interval")})
        return out

    def report(self, budget: float | None = None) -> str:
        lines = [f"IsoFLOP: {len(self.points)} points, {self.points['run'].nunique()} runs; "
                 f"{self.convention}; {self.level:.0%} intervals from {self.bootstrap} "
                 "bootstrap replicates (approach 2: residuals within budgets; approach 1: "
                 "budgets)"]
        for a in (self.approach1, self.approach2):
            if a is None:
                continue
            lines.append(f"  {a.name} ({len(a.optima)} budgets): N* ~ C^{a.n.exponent:.4f} "
                         f"[{a.n.exponent_interval[0]:.4f}, {a.n.exponent_interval[1]:.4f}], "
                         f"D* ~ C^{a.d.exponent:.4f} [{a.d.exponent_interval[0]:.4f}, "
                         f"{a.d.exponent_interval[1]:.4f}]")
            if budget is not None:
                n, n_iv = a.n.at(budget, self.level)
                d, d_iv = a.d.at(budget, self.level)
                lines.append(f"    at C = {budget:.3g}: N* = {n:.3g} [{n_iv[0]:.3g}, "
                             f"{n_iv[1]:.3g}], D* = {d:.3g} [{d_iv[0]:.3g}, {d_iv[1]:.3g}] "
                             f"tokens ({d / n:.3g} tokens per parameter)")
        if self.approach2 is None:
            lines.append("  approach 2: no budget with >= 3 sizes (not an IsoFLOP table)")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def isoflop_table(df: pd.DataFrame, *, where: str = "<table>") -> tuple[pd.DataFrame, str | None]:
    """The table isoflop needs: ``run, params, tokens, compute, loss, final`` (``final``: its
    run's last point), one of params/tokens from C = 6 N D, and which (or None)."""
    for col in ("compute", "loss"):
        if col not in df.columns or not df[col].notna().any():
            raise InputError("missing (a table needs compute, loss and params or tokens)",
                             path=where, field=col)
    have = {c for c in ("params", "tokens") if c in df.columns and df[c].notna().any()}
    if not have:
        raise InputError("needs params or tokens (the other comes from C = 6 N D)", path=where,
                         field="params")
    d = pd.DataFrame({"compute": pd.to_numeric(df["compute"], errors="coerce"),
                      "loss": pd.to_numeric(df["loss"], errors="coerce")})
    d["run"] = df["run"].astype(str).to_numpy() if "run" in df.columns else \
        [f"row{i}" for i in range(1, len(df) + 1)]
    derived = None
    for col in ("params", "tokens"):
        if col in have:
            d[col] = pd.to_numeric(df[col], errors="coerce").to_numpy()
        else:
            derived = col
    if derived is not None:
        other = "tokens" if derived == "params" else "params"
        d[derived] = d["compute"] / (FLOPS_PER_PARAM_TOKEN * d[other])
    d["fraction"] = pd.to_numeric(df["fraction"], errors="coerce").to_numpy() \
        if "fraction" in df.columns else 1.0
    num = d[["compute", "loss", "params", "tokens"]].to_numpy(float)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(num).all(axis=1) & (num > 0).all(axis=1)
    d = d[ok].reset_index(drop=True)
    if not len(d):
        raise InputError("no row with positive, finite compute, loss, params and tokens",
                         path=where, field="loss", exit_code=EX_DATAERR)
    last = d.groupby("run")["fraction"].transform("max")
    d["final"] = (d["fraction"] == last).to_numpy() | d["fraction"].isna().to_numpy()
    return d, derived


def budget_key(c: np.ndarray) -> np.ndarray:
    """Budgets equal to 3 significant digits are one budget."""
    return np.array([float(f"{x:.3g}") for x in c])


def window(x, y, octaves: float):
    """The points within ``octaves`` of the lowest loss (at least 3)."""
    i = int(np.argmin(y))
    near = np.abs(x - x[i]) <= octaves * math.log(2) + 1e-12
    if len(np.unique(x[near])) < 3:
        near = np.argsort(np.abs(x - x[i]), kind="stable")[:max(3, int(near.sum()))]
    return x[near], y[near]


def vertex(x, y):
    """Vertex of the least-squares parabola y ~ p2 x^2 + p1 x + p0: (x, y, found); not found
    (NaN) unless it opens upwards (p2 > 0)."""
    if len(np.unique(x)) < 3:
        return math.nan, math.nan, False
    p2, p1, p0 = np.polyfit(x, y, 2)
    if not p2 > 0:
        return math.nan, math.nan, False
    vx = -p1 / (2 * p2)
    return float(vx), float(p0 - p1 * p1 / (4 * p2)), True


def _power_law(c, y) -> tuple[float, float]:
    """exponent and log coefficient of y = k C^a by least squares in log-log."""
    c, y = np.asarray(c, float), np.asarray(y, float)
    ok = np.isfinite(c) & np.isfinite(y) & (c > 0) & (y > 0)
    if ok.sum() < 2 or len(np.unique(c[ok])) < 2:
        return math.nan, math.nan
    a, logk = np.polyfit(np.log(c[ok]), np.log(y[ok]), 1)
    return float(a), float(logk)


def _profile_fits(groups) -> list[dict]:
    """Approach 2's parabolas: per budget its window (log N, log D), fitted values, residuals."""
    out = []
    for c, ln, ld, y in groups:
        fit = {"compute": c, "n_points": len(y), "span": (ln.min(), ln.max())}
        for name, x in (("n", ln), ("d", ld)):
            wx, wy = window(x, y, WINDOW_OCTAVES)
            ok = len(np.unique(wx)) >= 3
            yhat = np.polyval(np.polyfit(wx, wy, 2), wx) if ok else wy
            # residuals scaled to the spread of the errors (3 parameters fitted)
            r = (wy - yhat) * math.sqrt(len(wy) / (len(wy) - 3)) if len(wy) > 3 \
                else np.zeros_like(wy)
            fit[name] = (wx, wy, yhat, r)
        out.append(fit)
    return out


def _profiles(fits) -> pd.DataFrame:
    """Approach 2: per budget the vertex of its parabola in log N and in log D."""
    rows = []
    for f in fits:
        vn, vy, okn = vertex(*f["n"][:2])
        vd, _, okd = vertex(*f["d"][:2])
        lo, hi = f["span"]
        off = (not okn) or vn < lo + 0.2 * (hi - lo) or vn > hi - 0.2 * (hi - lo)
        rows.append({"compute": f["compute"], "n_opt": _exp(vn) if okn else math.nan,
                     "d_opt": _exp(vd) if okd else math.nan,
                     "loss_opt": vy if okn else math.nan, "n_points": f["n_points"],
                     "off_centre": bool(off)})
    return pd.DataFrame(rows)


def _profile_draws(fits, rng, bootstrap: int) -> tuple[list, list]:
    """Approach 2's residual bootstrap: (exponent, log coefficient) draws for N* and for D*."""
    logc = np.log([f["compute"] for f in fits])
    out = {"n": [], "d": []}
    for name in ("n", "d"):
        vx = np.full((bootstrap, len(fits)), np.nan)
        for j, f in enumerate(fits):
            wx, _, yhat, r = f[name]
            if len(np.unique(wx)) < 3:
                continue
            ys = yhat[None, :] + r[rng.integers(0, len(r), (bootstrap, len(r)))]
            # least-squares parabolas of every replicate at once: one solve, many right sides
            p2, p1, _ = np.linalg.lstsq(np.vander(wx, 3), ys.T, rcond=None)[0]
            with np.errstate(divide="ignore", invalid="ignore"):
                vx[:, j] = np.where(p2 > 0, -p1 / (2 * p2), np.nan)
        for b in range(bootstrap):
            ok = np.isfinite(vx[b])
            out[name].append(tuple(np.polyfit(logc[ok], vx[b, ok], 1))
                             if ok.sum() >= 2 else (math.nan, math.nan))
    return out["n"], out["d"]


def _envelope_points(budgets) -> pd.DataFrame:
    """Approach 1 on single-point runs: the best run of each (compute, N, D, loss) budget."""
    rows = []
    for c, n, dd, y in budgets:
        j = int(np.argmin(y))
        rows.append({"compute": c, "n_opt": float(n[j]), "d_opt": float(dd[j]),
                     "loss_opt": float(y[j]), "n_points": len(y), "off_centre": False})
    return pd.DataFrame(rows)


def _envelope_curves(curves: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]]
                     ) -> pd.DataFrame:
    """Approach 1 on curves (params, log C, log L, log D per run): the run of lowest loss on a
    grid of C where two runs reach."""
    lo = [lc[0] for _, lc, _, _ in curves]
    hi = [lc[-1] for _, lc, _, _ in curves]
    cover_lo, cover_hi = sorted(lo)[1] if len(lo) > 1 else lo[0], \
        sorted(hi)[-2] if len(hi) > 1 else hi[0]
    if not cover_hi > cover_lo:
        cover_lo, cover_hi = min(lo), max(hi)
    grid = np.linspace(cover_lo, cover_hi, GRID)
    best_l = np.full(GRID, np.inf)
    best = np.full((GRID, 2), np.nan)
    for n, lc, ll, ld in curves:
        inside = (grid >= lc[0]) & (grid <= lc[-1])
        if not inside.any():
            continue
        li = np.interp(grid[inside], lc, ll)
        di = np.interp(grid[inside], lc, ld)
        pos = np.flatnonzero(inside)
        better = li < best_l[pos]
        best_l[pos[better]] = li[better]
        best[pos[better], 0] = n
        best[pos[better], 1] = np.exp(di[better])
    ok = np.isfinite(best_l)
    return pd.DataFrame({"compute": np.exp(grid[ok]), "n_opt": best[ok, 0],
                         "d_opt": best[ok, 1], "loss_opt": np.exp(best_l[ok]),
                         "n_points": 1, "off_centre": False})


def _curves(d: pd.DataFrame, runs) -> list:
    out = []
    for r in runs:
        g = d[d["run"] == r].sort_values("compute")
        g = g.drop_duplicates("compute", keep="last")
        out.append((float(g["params"].iloc[-1]), np.log(g["compute"].to_numpy()),
                    np.log(g["loss"].to_numpy()), np.log(g["tokens"].to_numpy())))
    return out


def isoflop(df: pd.DataFrame, *, bootstrap: int = 1000, level: float = 0.9, seed: int = 0,
            min_points: int = 3, where: str = "<table>") -> IsoflopResult:
    """Approaches 1 and 2 on a points table (see the module doc); bands by bootstrap."""
    d, derived = isoflop_table(df, where=where)
    rng = np.random.default_rng(seed)
    notes: list[str] = []

    def law(c, y, draws) -> PowerLaw:
        a, logk = _power_law(c, y)
        dr = np.asarray([x for x in draws if np.isfinite(x).all()]).reshape(-1, 2)
        iv = tuple(map(float, percentile_interval(dr[:, 0], level))) if len(dr) >= 2 \
            else (math.nan, math.nan)
        return PowerLaw(a, _exp(logk), iv, dr)

    # Approach 2: the final points of runs, grouped by budget
    finals = d[d["final"]]
    key = budget_key(finals["compute"].to_numpy())
    groups = [(float(np.exp(np.log(g["compute"]).mean())), np.log(g["params"].to_numpy()),
               np.log(g["tokens"].to_numpy()), g["loss"].to_numpy())
              for _, g in finals.groupby(key) if g["params"].nunique() >= min_points]
    a2 = None
    if len(groups) >= 2:
        fits = _profile_fits(groups)
        opt = _profiles(fits)
        for r in opt.itertuples():
            if r.off_centre:
                notes.append(f"budget {r.compute:.3g}: the optimum N = {r.n_opt:.3g} is "
                             f"off-centre in the sampled sizes (extrapolated, not measured)")
        nd, dd = _profile_draws(fits, rng, bootstrap)
        if bootstrap and all(np.ptp(f["n"][3]) < 1e-12 for f in fits):
            notes.append("every profile lies on its parabola (no residuals): approach 2's band "
                         "has no width; it holds the noise of the losses, and these have none")
        a2 = Approach("approach 2", opt, law(opt["compute"], opt["n_opt"], nd),
                      law(opt["compute"], opt["d_opt"], dd))

    # Approach 1: the envelope (curves when runs have several points, else budgets)
    with_curves = d.groupby("run").size().min() >= 2
    if with_curves:
        items, envelope = _curves(d, sorted(d["run"].unique())), _envelope_curves
    else:
        items = [(float(np.exp(np.log(g["compute"]).mean())), g["params"].to_numpy(),
                  g["tokens"].to_numpy(), g["loss"].to_numpy())
                 for _, g in d.groupby(budget_key(d["compute"].to_numpy()))]
        envelope = _envelope_points
    opt1 = envelope(items)
    if a2 is None and (len(opt1) < 2 or opt1["compute"].nunique() < 2):
        raise InputError("needs at least 2 compute budgets (or runs whose curves span more "
                         "than one compute value)", path=where, field="compute",
                         exit_code=EX_DATAERR)
    nd, dd = [], []
    for _ in range(bootstrap):  # the runs (or the budgets' best runs) resampled
        o = envelope([items[i] for i in rng.integers(0, len(items), len(items))])
        nd.append(_power_law(o["compute"], o["n_opt"]))
        dd.append(_power_law(o["compute"], o["d_opt"]))
    a1 = Approach("approach 1", opt1, law(opt1["compute"], opt1["n_opt"], nd),
                  law(opt1["compute"], opt1["d_opt"], dd))
    if with_curves:
        notes.append("approach 1 on curves: a point before the end of its run's schedule sits "
                     "above what a run planned for that compute reaches (Hoffmann et al. used "
                     "4 schedule lengths per size); read it as a bound")
    for n in notes:
        warnings.warn(n, stacklevel=2)
    return IsoflopResult(a1, a2, level, bootstrap, d, derived, tuple(notes))


__all__ = ["isoflop", "isoflop_table", "IsoflopResult", "Approach", "PowerLaw", "SCHEMA"]
