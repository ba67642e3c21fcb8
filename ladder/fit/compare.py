"""Two recipes on the same ladder sizes: the compute-equivalent multiplier of B over A
(:func:`compare_laws`, on two laws of one form fitted by ladder.fit.law.compare_points), per metric:

- the **multiplier** at compute C: ``m(C) = C_A(L_B(C)) / C``, the compute A's law needs to reach
  B's loss at C over C (> 1: B is worth that much more compute), at ``at`` (default the largest
  B run's compute; ``decades_beyond`` the runs when it extrapolates);
- **per size**, at each B run's compute: that multiplier, and the *paired* one of that B run over
  the A run of its size (A's law moved to pass through A's run): ((L_A - E) / (L_B - E))^(1 /
  alpha), the speedup of the Marin mixture study (marin-community/marin#9126) with a floor E;
- the **trend**: d ln m / d ln C across B's runs, fading or growing only when its interval
  excludes 0, flat only within +-5% per decade.

Bands: A's bootstrap draw r paired with B's draw r (independent fits), every quantity recomputed
per pair, its percentile interval widened to hold the estimate; a paired band adds both runs'
noise (``FitResult.noise_half_width``) by A's local slope. The bands hold parameter uncertainty,
not the laws' extrapolation error. Fewer than 20 pairs: NaN, with why.

Only laws of compute alone invert (``compute``, ``trajectory``, ``trajectory-capacity`` at
fraction 1), numerically on a log-log grid; a loss A's law never reaches is Infinity, not clipped.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from ladder.fit.forms import Model
from ladder.io import EX_USAGE, InputError

COMPARE_FORMS = ("compute", "trajectory", "trajectory-capacity")
GRID_DECADES = 12           # the inversion grid reaches this far beyond the runs, either way
GRID_PER_DECADE = 400       # grid points per decade: linear log-log interpolation error < 1e-5
MIN_PAIRS = 20              # as ladder.fit.result: fewer usable bootstrap draws give no band
# a B run and an A run are one size within 10**0.1 = 1.26x of compute (Marin's d1536: 1.0003x)
PAIR_DECADES = 0.1
# "flat": the trend's interval within +-5% per decade (a judgement call: below what a 3-5 rung
# ladder resolves)
FLAT_PER_DECADE = math.log(1.05) / math.log(10.0)
CURVE_POINTS = 60           # points of the drawn curves (compare.json's "curve")


@dataclass
class Comparison:
    """One metric's comparison of recipe B over recipe A (see the module docstring); the fields
    after ``metric`` in compare.json's order."""
    metric: str
    multiplier: float
    lo: float
    hi: float
    level: float
    at: float
    at_source: str
    decades_beyond: float
    per_size: list[dict]
    trend: dict
    form: str
    laws: dict
    points: dict
    curve: dict
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "metric"}


# ----------------------------------------------------------------------------- the laws


def final_points(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's final point (largest fraction), sorted by compute: the runs' end losses."""
    idx = df.groupby("run")["fraction"].idxmax()
    out = df.loc[idx, ["run", "compute", "loss"]].copy()
    return out.sort_values("compute").reset_index(drop=True)


def law_draws(res, n: int, seed: int) -> tuple[np.ndarray | None, str]:
    """Parameter draws of a fitted law, (R, P), and how they were made: its bootstrap draws,
    else ``n`` draws of a multivariate t with its residual dof from its covariance (as its own
    intervals assume), else none."""
    dof = getattr(res, "dof", None)
    if not (dof and dof > 0):
        # the law interpolates its runs: a zero-width band would claim what nothing measured
        return None, (f"none: {res.spec.n_free} free parameters for "
                      f"{(res.inputs or {}).get('n_runs', '?')} runs leave no residual "
                      "degrees of freedom (fix or tie a parameter, or add runs)")
    b = getattr(res, "boot_u", None)
    if b is not None and len(b) >= MIN_PAIRS:
        return np.asarray(b, float), "bootstrap"
    cov = getattr(res, "cov", None)
    if cov is None or n < MIN_PAIRS or not np.all(np.isfinite(cov)):
        return None, "none: no usable bootstrap replicates and no covariance"
    _u0, M = res.spec.mapping()
    rng = np.random.default_rng(seed)
    w, V = np.linalg.eigh((cov + cov.T) / 2)
    z = rng.standard_normal((n, len(w))) * np.sqrt(np.clip(w, 0, None))[None] @ V.T
    z /= np.sqrt(rng.chisquare(dof, size=(n, 1)) / dof)
    return res.u[None] + z @ M.T, f"delta method (multivariate t, {dof:.3g} dof)"


def _log_loss(res, log_c: np.ndarray, U: np.ndarray) -> np.ndarray:
    """ln L at the end of a run of compute exp(log_c), per row of ``U``: (R, len(log_c))."""
    c = np.exp(np.asarray(log_c, float))
    feats = res.spec.form.features({"compute": c, "fraction": np.ones_like(c)})
    return Model(res.spec.form, feats).log_predict(np.atleast_2d(U))


def _grid(lo: float, hi: float) -> np.ndarray:
    """ln C from ``lo`` to ``hi`` (ln units), GRID_DECADES beyond either way."""
    pad = GRID_DECADES * math.log(10.0)
    n = int(math.ceil((hi - lo + 2 * pad) / math.log(10.0) * GRID_PER_DECADE)) + 1
    return np.linspace(lo - pad, hi + pad, n)


class Inverse:
    """The compute a law needs to reach a loss, per parameter row of ``U``: its curve on ``grid``
    (ln C) evaluated once, inverted by linear interpolation in log-log."""

    def __init__(self, res, U: np.ndarray, grid: np.ndarray):
        self.grid = grid
        self.curves = _log_loss(res, grid, np.atleast_2d(U))     # (R, G), falls with compute
        # a row whose law is not non-increasing in compute (a negative exponent) has no inverse
        self.ok = np.array([bool(np.all(np.isfinite(y)) and np.all(np.diff(y) <= 1e-12))
                            for y in self.curves])

    def __call__(self, log_loss: np.ndarray) -> np.ndarray:
        """ln C reaching ``log_loss`` ((R, n) or (n,)): (R, n); +inf where never reached on the
        grid, -inf where reached before it, NaN for a row without an inverse."""
        R = len(self.curves)
        log_loss = np.asarray(log_loss, float)
        targets = np.broadcast_to(log_loss, (R,) + log_loss.shape[-1:])
        out = np.full(targets.shape, np.nan)
        for r in np.flatnonzero(self.ok):
            # np.interp needs increasing abscissae: -ln L rises with compute
            out[r] = np.interp(-targets[r], -self.curves[r], self.grid, left=-np.inf,
                               right=np.inf)
        return out


def _interval(center: float, draws: np.ndarray, level: float,
              extra: float = 0.0) -> tuple[float, float]:
    """``draws``' percentile interval widened to hold ``center``, plus ``extra`` in quadrature;
    NaN from fewer than MIN_PAIRS draws."""
    d = draws[~np.isnan(draws)]
    if len(d) < MIN_PAIRS or not math.isfinite(center):
        return math.nan, math.nan
    q = 0.5 + level / 2
    # draws may hold +-inf: the nearest order statistic, not an interpolation with inf
    lo_d = float(np.quantile(d, 1 - q, method="inverted_cdf"))
    hi_d = float(np.quantile(d, q, method="inverted_cdf"))
    down, up = max(center - lo_d, 0.0), max(hi_d - center, 0.0)
    if extra:
        down, up = math.hypot(down, extra), math.hypot(up, extra)
    return center - down, center + up


def _exp(x: float) -> float:
    """exp(x), inf beyond float64 (a multiplier A's law never reaches)."""
    with np.errstate(over="ignore"):
        return float(np.exp(x))


# ----------------------------------------------------------------------------- the comparison


def compare_laws(fa, fb, df_a: pd.DataFrame, df_b: pd.DataFrame, *, metric: str,
                 at: float | None = None, at_source: str | None = None,
                 level: float = 0.9, draws: int = 200, seed: int = 0) -> Comparison:
    """The comparison of two laws of one form in COMPARE_FORMS and their points tables."""
    if fa.form not in COMPARE_FORMS or fb.form not in COMPARE_FORMS:
        raise InputError(f"the multiplier needs a law of compute alone ({', '.join(COMPARE_FORMS)})"
                         f"; got {fa.form} and {fb.form}", field="--form", exit_code=EX_USAGE)
    notes: list[str] = []
    pa, pb = final_points(df_a), final_points(df_b)
    lca, lcb = np.log(pa["compute"].to_numpy(float)), np.log(pb["compute"].to_numpy(float))
    if at is None:
        at, at_source = float(np.exp(lcb.max())), "the largest B run"
    lat = math.log(at)
    span = (float(lcb.min()), float(lcb.max()))
    grid = _grid(min(lca.min(), lcb.min(), lat), max(lca.max(), lcb.max(), lat))

    ua, ub = fa.u[None], fb.u[None]
    (da, how_a), (db, how_b) = law_draws(fa, draws, seed), law_draws(fb, draws, seed + 1)
    n_pairs = 0 if da is None or db is None else min(len(da), len(db))
    if n_pairs == 0:
        notes.append("no band: " + "; ".join(
            f"{k}'s draws: {how.removeprefix('none: ')}"
            for k, d, how in (("A", da, how_a), ("B", db, how_b)) if d is None))
    da_p, db_p = (None, None) if n_pairs == 0 else (da[:n_pairs], db[:n_pairs])
    inv_a = Inverse(fa, ua, grid)
    inv_da = None if da is None else Inverse(fa, da, grid)
    inv_dp = (None if da_p is None else inv_da if len(da_p) == len(da)
              else Inverse(fa, da_p, grid))

    def law_log_m(log_c: np.ndarray):
        """ln m at each ln C: (point (n,), draws (R, n) or None)."""
        point = inv_a(_log_loss(fb, log_c, ub)[0])[0] - log_c
        if inv_dp is None:
            return point, None
        tb = _log_loss(fb, log_c, db_p)                          # (R, n): B's losses per draw
        return point, inv_dp(tb) - log_c[None]

    def with_band(log_c: np.ndarray):
        """ln m at each ln C and its interval's ends: three (n,) arrays."""
        p, d = law_log_m(log_c)
        ends = np.array([_interval(float(p[j]), d[:, j], level) if d is not None
                         else (math.nan, math.nan) for j in range(len(p))])
        return p, ends[:, 0], ends[:, 1]

    p_at, lo, hi = with_band(np.array([lat]))                   # at the target compute
    p_sz, lo_sz, hi_sz = with_band(lcb)                         # at each B run's final compute
    noise = [r.noise_half_width(level) if hasattr(r, "noise_half_width") else None
             for r in (fa, fb)]
    per_size = []
    for i, row in pb.iterrows():
        entry = {"run": str(row["run"]), "compute": float(row["compute"]),
                 "loss_b": float(row["loss"])}
        entry["law"] = {"multiplier": _exp(p_sz[i]), "lo": _exp(lo_sz[i]), "hi": _exp(hi_sz[i])}
        entry.update(_paired(inv_a, inv_da, pa, lca, row, level, noise))
        per_size.append(entry)
    trend = _trend(law_log_m, span, level, per_size)
    if trend.get("note"):
        notes.append(trend["note"])

    # the figure's curves: both laws and the multiplier with its band against compute
    cg = np.linspace(min(lca.min(), lcb.min(), lat) - 0.5, max(lca.max(), lcb.max(), lat) + 0.5,
                     CURVE_POINTS)
    p_c, lo_c, hi_c = with_band(cg)
    curve = {"compute": np.exp(cg).tolist(),
             "loss_a": np.exp(_log_loss(fa, cg, ua)[0]).tolist(),
             "loss_b": np.exp(_log_loss(fb, cg, ub)[0]).tolist(),
             "multiplier": [_exp(v) for v in p_c],
             "lo": [_exp(v) for v in lo_c], "hi": [_exp(v) for v in hi_c]}
    beyond = (lat - span[1]) / math.log(10.0)
    if beyond > 0.05:
        notes.append(f"the multiplier at {at:.3g} is extrapolated {beyond:.2f} decades beyond "
                     "the largest B run; its band holds the laws' parameter uncertainty, not "
                     "their extrapolation error")
    if not math.isfinite(float(p_at[0])):
        notes.append("A's law never reaches B's loss at the target (below A's asymptote): "
                     "the multiplier is unbounded" if p_at[0] > 0 else
                     "B's loss at the target is above A's law everywhere on the grid")
    return Comparison(
        metric=metric, form=fa.form, level=level, at=float(at), at_source=at_source or "--at",
        multiplier=_exp(p_at[0]), lo=_exp(lo[0]), hi=_exp(hi[0]), decades_beyond=float(beyond),
        per_size=per_size, trend=trend,
        laws={"a": _law_summary(fa, how_a, da), "b": _law_summary(fb, how_b, db),
              "pairs": int(n_pairs)},
        points={k: {"run": p["run"].astype(str).tolist(), "compute": p["compute"].tolist(),
                    "loss": p["loss"].tolist()} for k, p in (("a", pa), ("b", pb))},
        curve=curve, notes=notes)


def _paired(inv_a, inv_da, pa, lca, row, level, noise) -> dict:
    """The paired multiplier of one B run over the A run of its size (module docstring)."""
    lcb = math.log(float(row["compute"]))
    j = int(np.argmin(np.abs(lca - lcb)))
    if abs(lca[j] - lcb) > PAIR_DECADES * math.log(10.0):
        return {"run_a": None, "multiplier": None, "lo": None, "hi": None,
                "note": f"no A run within {10 ** PAIR_DECADES:.2f}x of its compute"}
    la, lb = math.log(float(pa["loss"].iloc[j])), math.log(float(row["loss"]))
    targets = np.array([lb, la])

    def log_m(inv):
        c = inv(targets)                                         # (R, 2)
        with np.errstate(invalid="ignore"):
            return c[:, 0] - c[:, 1] + lca[j] - lcb
    center = float(log_m(inv_a)[0])
    parts = ["A's law (bootstrap)"]
    extra = 0.0
    if all(n is not None for n in noise):
        # both runs' noise, in ln L, to ln C by A's local slope at B's loss
        dl = 1e-3
        c2 = inv_a(np.array([lb - dl, lb + dl]))[0]
        slope = (c2[0] - c2[1]) / (2 * dl)                      # -d ln C / d ln L > 0
        if math.isfinite(slope):
            extra = math.hypot(*noise) * abs(slope)
            parts.append("noise of both runs (each fit's residual quantile)")
    else:
        parts.append("no run noise: a fit has no residual degrees of freedom")
    if inv_da is None:
        lo = hi = math.nan
        parts = ["none: A's law has no parameter draws (see the notes)"]
    else:
        lo, hi = _interval(center, log_m(inv_da), level, extra)
    return {"run_a": str(pa["run"].iloc[j]), "loss_a": float(pa["loss"].iloc[j]),
            "compute_a": float(pa["compute"].iloc[j]), "multiplier": _exp(center),
            "lo": _exp(lo), "hi": _exp(hi), "band": parts}


def _trend(law_log_m, span, level, per_size) -> dict:
    """d ln m / d ln C across B's runs from the laws (draw by draw), and the verdict."""
    lo_c, hi_c = span
    out: dict = {"span": [_exp(lo_c), _exp(hi_c)], "level": level}
    if hi_c - lo_c < 0.1 * math.log(10.0):
        out.update(slope=None, lo=None, hi=None, verdict="undetermined",
                   note="B's runs span under 0.1 decade of compute: no trend with scale")
        return out
    p, d = law_log_m(np.array([lo_c, hi_c]))
    width = hi_c - lo_c
    slope = float((p[1] - p[0]) / width)
    lo = hi = math.nan
    if d is not None:
        with np.errstate(invalid="ignore"):
            s = (d[:, 1] - d[:, 0]) / width
        s = s[np.isfinite(s)]
        lo, hi = _interval(slope, s, level) if math.isfinite(slope) else (math.nan, math.nan)
    mid = float(np.nanmean(p)) if np.all(np.isfinite(p)) else math.nan
    out.update(slope=slope, lo=lo, hi=hi,
               per_decade=_exp(slope * math.log(10.0)) if math.isfinite(slope) else None,
               verdict=trend_verdict(slope, lo, hi, mid))
    paired = [(math.log(e["compute"]), math.log(e["multiplier"])) for e in per_size
              if e.get("multiplier") and 0 < e["multiplier"] < math.inf]
    obs = _observed_slope(paired, level)
    if obs is not None:
        obs["verdict"] = trend_verdict(obs["slope"], obs["lo"], obs["hi"],
                                       float(np.mean([m for _c, m in paired])))
    # beside the laws' trend, never in its place: its interval holds only the paired values'
    # scatter about a line, not the runs' noise
    out["observed"] = obs
    return out


def trend_verdict(slope: float, lo: float, hi: float, log_m: float) -> str:
    """A multiplier's trend from its slope d ln m / d ln C and interval: "fades" (towards 1) or
    "grows" when the interval excludes 0, "flat" within +-FLAT_PER_DECADE, else "undetermined"."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undetermined"
    if lo > 0 or hi < 0:
        if not math.isfinite(log_m) or log_m == 0:
            return "undetermined"
        return "fades" if slope * log_m < 0 else "grows"
    if -FLAT_PER_DECADE < lo and hi < FLAT_PER_DECADE:
        return "flat"
    return "undetermined"


def _observed_slope(pairs, level) -> dict | None:
    """OLS of ln m on ln C over the paired multipliers, with its t interval (n - 2 dof)."""
    if len(pairs) < 3:
        return None
    from scipy.special import stdtrit
    x, y = np.array(pairs).T
    xc = x - x.mean()
    b = float((xc * (y - y.mean())).sum() / (xc ** 2).sum())
    r = y - y.mean() - b * xc
    dof = len(x) - 2
    se = math.sqrt(float((r ** 2).sum()) / dof / float((xc ** 2).sum()))
    t = float(stdtrit(dof, 0.5 + level / 2))
    return {"slope": b, "lo": b - t * se, "hi": b + t * se, "sizes": len(x)}


def _law_summary(res, how: str, draws) -> dict:
    d = res.diagnostics or {}
    rule = d.get("asymptote_rule") or {}
    return {"form": res.form, "params": res.params,
            "asymptote": rule.get("chosen") if isinstance(rule, dict) else None,
            "runs": int((res.inputs or {}).get("n_runs", 0)),
            "draws": how, "n_draws": 0 if draws is None else int(len(draws))}


# ----------------------------------------------------------------------------- the report


def _x(v) -> str:
    """A multiplier: 1.012x between 0.01 and 1000, else 3.30e-04x."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if v == math.inf:
        return "inf"
    if v == 0 or 0.01 <= abs(v) < 1000:
        return f"{v:.3f}x"
    return f"{v:.2e}x"


def _s(v) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:+.4f}"


def _band(m, lo, hi) -> str:
    return f"{_x(m)} [{_x(lo)}, {_x(hi)}]"


def report(results: dict[str, Comparison], *, a: str = "A", b: str = "B") -> str:
    """The comparison as text (several metrics: a summary table first)."""
    out = [f"compute-equivalent multiplier of B ({b}) over A ({a}): the compute A needs to "
           "reach B's loss / B's compute"]
    if len(results) > 1:
        w = max(len(k) for k in results)
        out.append("")
        out.append(f"{'metric':<{w}}  {'multiplier [band]':>27}  {'at':>9}  "
                   f"{'per size (paired)':<26}  trend")
        for k, c in results.items():
            sizes = " ".join(_x(e.get("multiplier")) for e in c.per_size)
            out.append(f"{k:<{w}}  {_band(c.multiplier, c.lo, c.hi):>27}  {c.at:>9.3g}  "
                       f"{sizes:<26}  {c.trend.get('verdict')}")
    for k, c in results.items():
        out.append("")
        la, lb = c.laws["a"], c.laws["b"]
        out.append(f"{k}: form {c.form}; A: " + _params(la) + "; B: " + _params(lb))
        out.append(f"  at {c.at:.4g} FLOPs ({c.at_source}): {_band(c.multiplier, c.lo, c.hi)}"
                   f" at {c.level:g} (draws: A {la['draws']}, B {lb['draws']}; "
                   f"{c.laws['pairs']} pairs)")
        out.append(f"  {'B run':<22} {'compute':>9} {'loss B':>8} {'A run':<22} {'loss A':>8}"
                   f"  {'paired [band]':>27}  {'laws [band]':>27}")
        for e in c.per_size:
            la_ = e.get("loss_a")
            out.append(f"  {e['run'][:22]:<22} {e['compute']:>9.3g} {e['loss_b']:>8.5g} "
                       f"{(e.get('run_a') or '-')[:22]:<22} "
                       f"{'-' if la_ is None else format(la_, '.5g'):>8}  "
                       f"{_band(e.get('multiplier'), e.get('lo'), e.get('hi')):>27}  "
                       f"{_band(e['law']['multiplier'], e['law']['lo'], e['law']['hi']):>27}")
        t = c.trend
        if t.get("slope") is not None:
            obs = t.get("observed")
            extra = ("" if not obs else f"; the paired sizes' own regression "
                     f"({obs['sizes']} sizes, their scatter only): {_s(obs['slope'])} "
                     f"[{_s(obs['lo'])}, {_s(obs['hi'])}] ({obs['verdict']})")
            out.append(f"  trend with scale (laws): d ln m / d ln C = {_s(t['slope'])} "
                       f"[{_s(t['lo'])}, {_s(t['hi'])}] (x{t['per_decade']:.3f} per decade, "
                       f"{t['span'][0]:.3g}..{t['span'][1]:.3g}): {t['verdict']}{extra}")
        else:
            out.append(f"  trend with scale: {t['verdict']}")
        for n in c.notes:
            out.append(f"  note: {n}")
    return "\n".join(out)


def _params(law: dict) -> str:
    s = ", ".join(f"{k}={v:.4g}" for k, v in law["params"].items()
                  if k in ("E", "A", "alpha", "B", "beta"))
    return s + (f" ({law['asymptote']})" if law.get("asymptote") else "")
