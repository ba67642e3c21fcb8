"""Forecast a target run's metric curve from a law, with a band, and check that band's calibration.

The band of a forecast point combines, in quadrature (independent errors, Gaussian approximation):
- the law's band at the level, as returned by ``law.predict`` (fit.result: bootstrap parameter
  uncertainty, run-to-run residual noise, and the law's extrapolation error: a pre-registered
  target lies beyond every rung, and the ladder measured how wrong its law is one step outside
  them with the rollout backtest, which refits on the smaller rungs and forecasts the next one;
  its log error per decade times the target's decades outside the fitted range. Without it a
  band narrowed by honest bootstrap replicates missed the cpu demo's proxy hero, -5.0% against a
  [-2.7%, +8.2%] band, docs/LOG.md. :func:`extrapolation_error` reports that term for
  prereg.json; it is added here only for a law whose band lacks it), and
- evaluation noise: the scatter of a single eval about the run's smooth curve (finite eval set),
  estimated from the ladder's eval points (:func:`estimate_eval_noise`) or given.
A band the law cannot compute stays NaN (missing, loudly), never zero width.

Calibration (:func:`leave_one_rung_out`) refits the law without one rung, forecasts that rung's
points and counts how many fall inside the band: a 90% band should hold about 90%.

No JAX here, and ``fit`` is imported lazily (only to load a law from a file).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ladder.io import (MAX_STEP, InputError, as_float, number, require, sha256_of)
from ladder.runs import EXCLUDED, read_runs
from predict.prereg_view import ForecastBand

# Token-budget multipliers of the planned run at which the law's final value is tabulated, for the
# contingency advisory ("at what budget is the registered final value still reached?").
BUDGET_MULTIPLIERS = (0.25, 0.35, 0.5, 0.6, 0.7, 0.85, 1.0, 1.2, 1.4, 1.7, 2.0, 2.5, 3.0, 4.0)


# ------------------------------------------------------------------------------------ target


@dataclass(frozen=True)
class Target:
    """The run to forecast (the ``target`` section of a pre-registration)."""

    name: str
    params: float
    active_params: float
    tokens: float
    steps: int
    compute: float               # planned training FLOPs without LM head (flops-v1)
    seq_len: int
    schedule: dict = field(default_factory=dict)
    eval_steps: tuple = ()
    batch: int | None = None
    config_hash: str | None = None

    def __post_init__(self):
        for name in ("params", "active_params", "tokens", "compute"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be a positive number, got {v!r}")
        for name in ("steps", "seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        object.__setattr__(self, "eval_steps", tuple(int(s) for s in self.eval_steps))

    @classmethod
    def from_rung(cls, rung) -> Target:
        p = rung.params
        return cls(name=f"{rung.ladder}:{rung.name}", params=float(p.total),
                   active_params=float(p.active), tokens=float(rung.tokens), steps=rung.steps,
                   compute=float(rung.compute()), seq_len=rung.seq_len,
                   schedule=rung.schedule.to_dict(), eval_steps=tuple(rung.eval_steps()),
                   batch=rung.batch, config_hash=sha256_of(rung.to_dict()))

    @classmethod
    def from_spec(cls, d: Mapping, *, path=None) -> Target:
        """From a ``--target-spec`` JSON object (a pre-registration's ``target`` fields)."""
        if "target" in d and isinstance(d["target"], Mapping):
            d = d["target"]
        kw: dict[str, Any] = {}
        for key in ("params", "active_params", "tokens", "compute"):
            kw[key] = float(number(require(d, key, (int, float), path=path), field=key,
                                   path=path, lo=0, lo_open=True))
        for key in ("steps", "seq_len"):
            kw[key] = number(require(d, key, (int, float), path=path), field=key, path=path,
                             lo=1, hi=MAX_STEP, integral=True)
        kw["name"] = str(d.get("name", Path(str(path or "target")).stem))
        sched = d.get("schedule", {})
        if isinstance(sched, str):
            sched = {"kind": sched}
        if not isinstance(sched, Mapping):
            raise InputError("expected an object or a name", path=path, field="schedule")
        from ladder.specs import Schedule  # plain Python: the trainer's own schedule check
        try:
            Schedule(**dict(sched))
        except (TypeError, ValueError) as e:
            msg = str(e).split(": ", 1)[-1] if ": " in str(e) else str(e)
            raise InputError(msg, path=path, field="schedule") from None
        kw["schedule"] = dict(sched)
        ev = d.get("eval_steps", ())
        if not isinstance(ev, (list, tuple)):
            raise InputError("expected a list of steps", path=path, field="eval_steps")
        kw["eval_steps"] = tuple(number(s, field="eval_steps", path=path, lo=0,
                                        hi=kw["steps"], integral=True) for s in ev)
        if d.get("batch") is not None:
            kw["batch"] = number(d["batch"], field="batch", path=path, lo=1, hi=MAX_STEP,
                                 integral=True)
        if d.get("config_hash") is not None:
            kw["config_hash"] = str(d["config_hash"])
        try:
            return cls(**kw)
        except ValueError as e:
            field_name = str(e).split(":")[0]
            raise InputError(str(e).split(": ", 1)[-1], path=path, field=field_name) from None

    def to_dict(self) -> dict:
        return {"name": self.name, "params": self.params, "active_params": self.active_params,
                "tokens": self.tokens, "steps": self.steps, "compute": self.compute,
                "seq_len": self.seq_len, "schedule": dict(self.schedule),
                "eval_steps": list(self.eval_steps), "batch": self.batch,
                "config_hash": self.config_hash}

    def at(self, fraction: np.ndarray) -> dict:
        """Law inputs at ``fraction`` of the run: tokens and compute so far (a constant batch and
        sequence length make both proportional to the fraction; flops-v1 is linear in tokens)."""
        g = np.asarray(fraction, dtype=float)
        return {"params": np.full(g.shape, self.params),
                "active_params": np.full(g.shape, self.active_params),
                "tokens": g * self.tokens, "compute": g * self.compute, "fraction": g}


# ------------------------------------------------------------------------------------ noise


@dataclass(frozen=True)
class EvalNoise:
    """Standard deviation of one eval's metric about the run's smooth curve."""

    sigma: float
    n: int
    method: str

    def to_dict(self) -> dict:
        return {"sigma": self.sigma, "n": self.n, "method": self.method}


def estimate_eval_noise(curves: Iterable[tuple[np.ndarray, np.ndarray]], *,
                        min_fraction: float = 0.2) -> EvalNoise:
    """Eval noise from the scatter of each eval about the line through its two neighbours.

    For three consecutive evals at fractions x0 < x1 < x2 of a smooth curve, the residual
    r = y1 - (w y0 + (1 - w) y2), w = (x2 - x1)/(x2 - x0), has variance sigma^2 (1 + w^2 + (1-w)^2)
    when the eval errors are independent with sd sigma, and the curve's own curvature is small
    (hence only evals after ``min_fraction`` of the run). Robust scale: 1.4826 x MAD.
    """
    z = []
    for x, y in curves:
        x, y = np.asarray(x, float), np.asarray(y, float)
        ok = np.isfinite(x) & np.isfinite(y) & (x >= min_fraction)
        x, y = x[ok], y[ok]
        order = np.argsort(x)
        x, y = x[order], y[order]
        if x.size < 3:
            continue
        x0, x1, x2 = x[:-2], x[1:-1], x[2:]
        w = (x2 - x1) / np.maximum(x2 - x0, 1e-300)
        r = y[1:-1] - (w * y[:-2] + (1 - w) * y[2:])
        z.append(r / np.sqrt(1 + w ** 2 + (1 - w) ** 2))
    if not z:
        return EvalNoise(sigma=math.nan, n=0, method="second-difference MAD (no data)")
    zz = np.concatenate(z)
    sigma = float(1.4826 * np.median(np.abs(zz - np.median(zz))))
    return EvalNoise(sigma=sigma, n=int(zz.size), method="second-difference MAD")


# ------------------------------------------------------------------------------------ forecast


@dataclass(frozen=True)
class Forecast(ForecastBand):
    """A target's metric curve with its band (the :class:`ForecastBand` that prereg.json
    registers) and how it was made. Arrays share one index (the grid)."""

    final: dict
    level: float
    eval_noise: float
    law_lo: np.ndarray
    law_hi: np.ndarray

    def points(self) -> list[dict]:
        return [{"fraction": float(f), "step": int(s), "tokens": float(t), "loss": float(l),
                 "lo": float(a), "hi": float(b)}
                for f, s, t, l, a, b in zip(self.fraction, self.step, self.tokens, self.loss,
                                            self.lo, self.hi, strict=True)]


def _z(level: float) -> float:
    from scipy.stats import norm
    return float(norm.ppf(0.5 + level / 2))


def combine_band(loss, lo, hi, *, level: float, eval_noise: float, extrapolation: float = 0.0):
    """Widen the law's band [lo, hi] by eval noise (sd in loss units) and the extrapolation error
    (a relative sd, see :func:`extrapolation_error`) in quadrature on each side."""
    loss, lo, hi = (np.asarray(a, float) for a in (loss, lo, hi))
    e = 0.0 if eval_noise is None or not math.isfinite(eval_noise) else float(eval_noise)
    x = 0.0 if extrapolation is None or not math.isfinite(extrapolation) else float(extrapolation)
    extra = (_z(level) * e) ** 2 + (_z(level) * x * loss) ** 2
    lo2 = loss - np.sqrt((loss - lo) ** 2 + extra)
    hi2 = loss + np.sqrt((hi - loss) ** 2 + extra)
    return lo2, hi2  # NaN stays NaN: missing uncertainty is never made up


def grid_fractions(target: Target, *, every: float = 0.01) -> np.ndarray:
    """Every 1% of the run, the target's eval steps, and the end."""
    n = int(round(1 / every))
    g = set(np.round(np.arange(1, n + 1) / n, 10).tolist())
    g.update(s / target.steps for s in target.eval_steps if 0 < s <= target.steps)
    g.add(1.0)
    return np.array(sorted(g))


def _predict(law, inputs: Mapping, level: float):
    res = law.predict(params=inputs["params"], active_params=inputs["active_params"],
                      tokens=inputs["tokens"], compute=inputs["compute"],
                      fraction=inputs["fraction"], level=level)
    shape = np.shape(inputs["fraction"])
    return tuple(np.broadcast_to(np.asarray(getattr(res, k), float), shape).copy()
                 for k in ("loss", "lo", "hi"))


def forecast(law, target: Target, *, level: float = 0.9, eval_noise: float = 0.0,
             extrapolation: float = 0.0, every: float = 0.01) -> Forecast:
    """The target's forecast on the grid (every ``every`` of the run + eval steps + final);
    ``extrapolation``: the relative sd of :func:`extrapolation_error` (0: none)."""
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    g = grid_fractions(target, every=every)
    loss, lo, hi = _predict(law, target.at(g), level)
    lo2, hi2 = combine_band(loss, lo, hi, level=level, eval_noise=eval_noise,
                            extrapolation=extrapolation)
    steps = np.rint(g * target.steps).astype(np.int64)
    final = {"loss": float(loss[-1]), "lo": float(lo2[-1]), "hi": float(hi2[-1])}
    return Forecast(fraction=g, step=steps, tokens=g * target.tokens, loss=loss, lo=lo2, hi=hi2,
                    final=final, level=level, eval_noise=float(eval_noise or 0.0),
                    law_lo=lo, law_hi=hi)


@dataclass(frozen=True)
class Extrapolation:
    """How wrong the law was when the ladder extrapolated it one rung (a relative sd)."""

    sigma_log: float
    n: int
    method: str
    in_law_band: bool = False  # the law's own band holds it (fit.law.FitResult)

    def to_dict(self) -> dict:
        return {"sigma_log": self.sigma_log, "n": self.n, "method": self.method,
                "in_law_band": self.in_law_band}


def extrapolation_error(law, target: Target | None = None) -> Extrapolation:
    """The law's own extrapolation error at ``target``, from its rollout backtest (law.json
    ``diagnostics.backtest``: refit on the runs below each scale level, forecast that level's
    final losses; each fold records how many decades it extrapolated).

    The error of a power law extrapolated from a ladder grows with the distance: the held-out
    log errors are put per decade, pooled over every held-out point outside its fold's range
    (r^2 = sum e^2 / sum d^2, d the largest distance in decades outside the fitted range over
    the form's inputs: fit.backtest), and scaled to the target's distance. A law.json written
    before that keeps the per-fold RMS of log error / decades on one scale. A target inside the
    range gets none.
    No backtest (a curve law, or a fit with ``backtest=False``) or no scale to place the
    target: 0, and the method says so.

    The law's band already holds this term (``FitResult.extrapolation_log_sd``, issue 13: so
    that one place computes a law's band); ``in_law_band`` says so and the forecast does not
    add it again. It is recorded in prereg.json as ``extrapolation``."""
    from fit.result import extrapolation_rate
    bt = (getattr(law, "diagnostics", None) or {}).get("backtest") or {}
    rate, kind, _bottom, top = extrapolation_rate(bt)
    n = sum(1 for f in bt.get("folds") or [] if isinstance(f, dict)
            and isinstance(f.get("decades"), (int, float)) and f["decades"] > 0
            for e in f.get("final_rel_err") or [] if isinstance(e, (int, float))
            and math.isfinite(e) and e > -1)
    in_band = hasattr(law, "extrapolation_log_sd")
    scale = None if target is None else {"compute": target.compute,
                                         "params_x_tokens": target.params * target.tokens,
                                         "params": target.params}.get(kind)
    if rate is None or not scale or scale <= 0:
        return Extrapolation(0.0, n, "none (the law carries no rollout backtest on a scale "
                                     "the target has)", in_band)
    if in_band:
        sd = float(law.extrapolation_log_sd(params=target.params, tokens=target.tokens,
                                            compute=target.compute, fraction=1.0,
                                            active_params=target.active_params))
    else:
        sd = rate * max(0.0, math.log10(scale) - top)
    decades = sd / rate if rate > 0 else 0.0
    pooled = bt.get("extrapolation") if isinstance(bt.get("extrapolation"), dict) else None
    if pooled is not None and pooled.get("rate_per_decade") is not None:
        # the pooled rate (fit.backtest): every held-out point outside its fold's range, the
        # distance over the form's inputs
        n = int(pooled.get("n_points") or 0)
        inputs = ", ".join(map(str, pooled.get("inputs") or [])) or kind
        points = f"{n} held-out point{'s' if n != 1 else ''}"
        what = (f"rollout backtest of the law: log error {rate:.4f} per decade (pooled over "
                f"{points}) x {decades:.2f} decades outside the fitted range of {inputs}")
    else:
        what = (f"rollout backtest of the law: RMS log error {rate:.4f} per decade (of {kind}) "
                f"x {decades:.2f} decades outside the ladder's runs")
    return Extrapolation(sd, n, what + ("; inside the law's band" if in_band else ""), in_band)


def budget_curve(law, target: Target) -> dict:
    """The law's final metric if the run were given ``m`` x its planned tokens (decay re-aimed to
    the new end: fraction 1 of a run of that budget), for the contingency advisory."""
    m = np.array(BUDGET_MULTIPLIERS)
    inputs = {"params": np.full(m.shape, target.params),
              "active_params": np.full(m.shape, target.active_params),
              "tokens": m * target.tokens, "compute": m * target.compute,
              "fraction": np.ones(m.shape)}
    loss, _, _ = _predict(law, inputs, 0.9)
    return {"multiplier": m.tolist(), "tokens": (m * target.tokens).tolist(),
            "loss": loss.tolist()}


# ------------------------------------------------------------------------------------ calibration


@dataclass(frozen=True)
class RungCoverage:
    run: str
    n: int
    inside: int
    above: int
    below: int
    missing: int           # points whose band could not be computed (NaN): not counted inside
    mean_rel_error: float
    inside_law_only: int = 0  # inside the law's own band, without the eval-noise term

    @property
    def coverage(self) -> float:
        return self.inside / self.n if self.n else math.nan


@dataclass(frozen=True)
class Calibration:
    """Leave-one-rung-out coverage of the band."""

    level: float
    rungs: tuple[RungCoverage, ...]

    @property
    def n(self) -> int:
        return sum(r.n for r in self.rungs)

    @property
    def coverage(self) -> float:
        n = self.n
        return sum(r.inside for r in self.rungs) / n if n else math.nan

    @property
    def coverage_law_only(self) -> float:
        n = self.n
        return sum(r.inside_law_only for r in self.rungs) / n if n else math.nan

    def report(self) -> str:
        lines = [f"leave-one-rung-out coverage of the {self.level:.0%} band: {self.coverage:.1%} "
                 f"of {self.n} points (the law's band alone: {self.coverage_law_only:.1%})"]
        for r in self.rungs:
            lines.append(f"  {r.run:<24} {r.coverage:6.1%} of {r.n:4d} (above {r.above}, below "
                         f"{r.below}, no band {r.missing}), mean |rel err| "
                         f"{r.mean_rel_error:.3%}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"level": self.level, "coverage": self.coverage, "n": self.n,
                "rungs": [{"run": r.run, "n": r.n, "inside": r.inside, "above": r.above,
                           "below": r.below, "missing": r.missing, "coverage": r.coverage,
                           "mean_rel_error": r.mean_rel_error} for r in self.rungs]}


def leave_one_rung_out(points, fit_fn: Callable[[Any], Any], *, level: float = 0.9,
                       eval_noise: float = 0.0, min_fraction: float = 0.01,
                       runs: Iterable[str] | None = None) -> Calibration:
    """Refit without each rung (``fit_fn(points_without_it) -> law``), forecast its points.

    ``points`` is a points table (pandas DataFrame with ``run, params, active_params, tokens,
    compute, fraction, loss``). Points before ``min_fraction`` are not scored (the watcher does
    not compare them either).
    """
    import pandas as pd

    df = pd.DataFrame(points)
    for col in ("run", "loss", "fraction"):
        if col not in df:
            raise InputError("missing column", field=col)
    out = []
    for run in (runs or list(dict.fromkeys(df["run"]))):
        train = df[df["run"] != run]
        test = df[(df["run"] == run) & (df["fraction"] >= min_fraction)]
        if test.empty:
            continue
        law = fit_fn(train)
        inputs = {k: test[k].to_numpy(float) if k in test else np.full(len(test), np.nan)
                  for k in ("params", "active_params", "tokens", "compute", "fraction")}
        loss, lo0, hi0 = _predict(law, inputs, level)
        lo, hi = combine_band(loss, lo0, hi0, level=level, eval_noise=eval_noise)
        y = test["loss"].to_numpy(float)
        has = np.isfinite(lo) & np.isfinite(hi)
        inside = has & (y >= lo) & (y <= hi)
        out.append(RungCoverage(run=str(run), n=len(y), inside=int(inside.sum()),
                                above=int((has & (y > hi)).sum()),
                                below=int((has & (y < lo)).sum()), missing=int((~has).sum()),
                                mean_rel_error=float(np.mean(np.abs(loss / y - 1))),
                                inside_law_only=int((has & (y >= lo0) & (y <= hi0)).sum())))
    return Calibration(level=level, rungs=tuple(out))


# ------------------------------------------------------------------------------------ ladder runs


@dataclass(frozen=True)
class LadderRun:
    """A finished ladder run read from its directory (for references and eval noise)."""

    path: str
    name: str
    steps: int
    rows: list


def read_ladder_runs(runs_dir: str | Path, *, include_targets: bool = False) -> list[LadderRun]:
    """Every run directory with metrics under ``runs_dir`` (:func:`ladder.runs.find_run_dirs`).
    Target runs (``rung.is_target``) are left out unless asked, and diverged or failed runs
    always: the references describe the healthy ladder, not the run being watched."""
    root = Path(runs_dir)
    if not root.exists():
        raise InputError("no such directory", path=root, field="--runs")
    out = []
    for run in read_runs(root):  # ladder.runs: the reader fit and reports use too
        if (run.is_target and not include_targets) or run.status in EXCLUDED or not run.rows:
            continue
        out.append(LadderRun(path=str(run.path), name=run.name, steps=run.planned_steps(),
                             rows=run.rows))
    return out


def _run_fraction(run: LadderRun, row: Mapping) -> float:
    p = as_float(row.get("progress"))
    if p is not None and math.isfinite(p):
        return p
    return row["step"] / run.steps


def eval_noise_from_runs(runs: list[LadderRun], metric: str) -> EvalNoise:
    curves = []
    for run in runs:
        xs, ys = [], []
        for r in run.rows:
            v = as_float(r.get(metric))
            if v is not None and math.isfinite(v):
                xs.append(_run_fraction(run, r))
                ys.append(v)
        curves.append((np.array(xs), np.array(ys)))
    return estimate_eval_noise(curves)


HEALTH_KEYS = ("moe/drop_frac", "grad/norm", "moe/router_entropy", "moe/load_max_over_mean")


def _smoothed_bins(fr: np.ndarray, v: np.ndarray, centers: np.ndarray, width: float) -> np.ndarray:
    """Median of ``v`` within +-width/2 of each bin centre (NaN where the run has no row there).
    A window in fraction, not in rows, so that rungs with 70 and 400 steps are smoothed alike."""
    order = np.argsort(fr, kind="stable")
    fr, v = fr[order], v[order]
    lo = np.searchsorted(fr, centers - width / 2, side="left")
    hi = np.searchsorted(fr, centers + width / 2, side="right")
    out = np.full(centers.size, np.nan)
    for j, (a, b) in enumerate(zip(lo, hi, strict=True)):
        if b > a:
            out[j] = np.median(v[a:b])
    return out


def envelope_tolerance(m: np.ndarray, *, min_others: int = 2) -> dict:
    """How far (in log units) a rung strays outside the envelope of the *other* rungs at the same
    fraction of the schedule, worst case over rungs and fractions: leave-one-rung-out. Health
    signals differ between model sizes and depths (router entropy of the cpu ladder at 30% of
    the run: 0.6 to 1.5 across rungs), so the distance a healthy new size may lie outside the
    ladder's range is measured on the ladder itself rather than assumed. ``m``: runs x bins of
    positive values. None per side when fewer than ``min_others`` + 1 runs have data."""
    out = {"below": None, "above": None, "runs": int(m.shape[0])}
    if m.shape[0] < min_others + 1:
        return out
    with np.errstate(all="ignore"):
        lm = np.log(np.where(m > 0, m, np.nan))
    below, above = [], []
    for r in range(lm.shape[0]):
        others = np.delete(lm, r, axis=0)
        enough = np.isfinite(others).sum(axis=0) >= min_others
        ok = enough & np.isfinite(lm[r])
        if not ok.any():
            continue
        below.append(np.max(np.nanmin(others[:, ok], axis=0) - lm[r, ok]))
        above.append(np.max(lm[r, ok] - np.nanmax(others[:, ok], axis=0)))
    if below:
        out["below"] = max(0.0, float(max(below)))
        out["above"] = max(0.0, float(max(above)))
    return out


def health_reference(runs: list[LadderRun], *, bins: int = 100, grad_after: float = 0.02,
                     smooth: float = 0.05) -> dict:
    """The ladder's health signals per 1% of the schedule: median, min and max across rungs of
    each rung's median within +-``smooth``/2 of the bin centre, and the leave-one-rung-out
    ``tolerance`` of the envelope (:func:`envelope_tolerance`). Parameter norms
    (``params/norm/<group>``, not router_bias) are stored relative to each rung's value at
    ``grad_after`` of its run, since their absolute size grows with width; the watcher compares
    growth with growth."""
    edges = np.linspace(0, 1, bins + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    keys = set(HEALTH_KEYS)
    for run in runs:
        for r in run.rows[:50] + run.rows[-50:]:
            keys.update(k for k in r if k.startswith("params/norm/") and
                        not k.endswith("/router_bias"))
    signals: dict[str, dict] = {}
    for key in sorted(keys):
        per_run = []
        for run in runs:
            fr = np.array([_run_fraction(run, r) for r in run.rows])
            v = np.array([np.nan if as_float(r.get(key)) is None else as_float(r.get(key))
                          for r in run.rows], dtype=float)
            ok = np.isfinite(fr) & np.isfinite(v)
            if ok.sum() < 2:
                continue
            fr, v = fr[ok], v[ok]
            if key.startswith("params/norm/"):
                base = v[np.searchsorted(fr, grad_after).clip(0, len(v) - 1)]
                if not base:
                    continue
                v = v / base
            per_run.append(_smoothed_bins(fr, v, centers, smooth))
        if not per_run:
            continue
        m = np.vstack(per_run)
        with np.errstate(all="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                signals[key] = {"median": np.nanmedian(m, axis=0).tolist(),
                                "min": np.nanmin(m, axis=0).tolist(),
                                "max": np.nanmax(m, axis=0).tolist(),
                                "tolerance": envelope_tolerance(m),
                                "relative_to": (f"value at {grad_after:.0%}"
                                                if key.startswith("params/norm/") else None),
                                "runs": len(per_run)}
    return {"fractions": centers.tolist(), "signals": signals, "smooth": smooth,
            "runs": [r.name for r in runs]}


@dataclass(frozen=True)
class SpikeScores:
    z: np.ndarray        # robust z-score of each value (NaN where not yet defined)
    median: np.ndarray   # the trailing median it is measured from (rows before, NaN at first)


def spike_scores(x: np.ndarray, window: int) -> SpikeScores:
    """Robust z-score of each value against the ``window`` finite values before it:
    (x - trailing median) / (1.4826 x trailing MAD), where the MAD is the trailing median of the
    absolute deviations from the rolling median (robust to the falling trend of a loss curve);
    NaN until two quarter windows are seen. The same function judges the target
    (predict.watch) and calibrates ``spike_k`` on the ladder."""
    # pandas' rolling medians, computed by predict.watch.rolling (the same numbers, ~3x faster:
    # this was 0.7 s of the 1M-line first read of bench/watch_follow_speed.py)
    from predict.watch.rolling import rolling_median
    x = np.asarray(x, float)
    ok = ~np.isnan(x)
    fin = x[ok]  # NaN rows dropped (an infinity stays, as in pandas' dropna)
    minp = max(3, window // 4)
    med = rolling_median(fin, window, minp)
    # the deviations are NaN in the first minp - 1 rows (too few values): a rolling median that
    # skips them is one over the rest, whose first windows are as short as those rows leave
    k = min(minp - 1, fin.size)
    mad = np.concatenate([np.full(k, np.nan),
                          rolling_median(np.abs(fin - med)[k:], window, minp)])
    med = np.concatenate([[np.nan], med[:-1]])[:fin.size]  # the rows before each row
    mad = np.concatenate([[np.nan], mad[:-1]])[:fin.size]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (fin - med) / (1.4826 * mad)
    zs, ms = np.full(x.size, np.nan), np.full(x.size, np.nan)
    zs[ok], ms[ok] = z, med
    return SpikeScores(z=zs, median=ms)


def calibrate_spike_k(runs: list[LadderRun], window: int, *, key: str = "train/loss") -> dict:
    """The largest robust z-score of ``key`` (:func:`spike_scores`) over the ladder's healthy runs:
    the watcher's spike threshold is set above it (``spike_k`` in the decision rule)."""
    worst, n = None, 0
    for run in runs:
        x = np.array([np.nan if as_float(r.get(key)) is None else as_float(r.get(key))
                      for r in run.rows], dtype=float)
        with np.errstate(all="ignore"):
            z = spike_scores(x, window).z
        z = z[np.isfinite(z)]
        if z.size:
            n += 1
            worst = float(z.max()) if worst is None else max(worst, float(z.max()))
    return {"max_z": worst, "runs": n, "key": key, "window": window}
