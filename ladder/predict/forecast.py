"""Forecast a target run's metric curve from a law on a grid of its run (its band from
:mod:`predict.band`), and the ladder's references the watcher compares the run with (health
signals, spike threshold, eval noise). No JAX here.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ladder.io import MAX_STEP, InputError, as_float, number, require, sha256_of
from ladder.predict.band import EvalNoise, estimate_eval_noise, law_band, target_band
from ladder.predict.prereg_view import ForecastBand
from ladder.sources.runs import EXCLUDED, read_runs

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
            raise InputError(str(e).split(": ", 1)[-1], path=path, field="schedule") from None
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
        return cls(**kw)  # every field checked above, as strictly as __post_init__ does

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "eval_steps": list(self.eval_steps)}

    def at(self, fraction: np.ndarray) -> dict:
        """Law inputs at ``fraction`` of the run (tokens and compute so far are proportional to
        it: a constant batch and sequence length; flops-v1 is linear in tokens)."""
        g = np.asarray(fraction, dtype=float)
        return {"params": np.full(g.shape, self.params),
                "active_params": np.full(g.shape, self.active_params),
                "tokens": g * self.tokens, "compute": g * self.compute, "fraction": g}


# ------------------------------------------------------------------------------------ forecast


@dataclass(frozen=True)
class Forecast(ForecastBand):
    """A target's metric curve with its band (the :class:`ForecastBand` prereg.json registers)
    and how it was made."""

    final: dict
    level: float
    eval_noise: float

    def points(self) -> list[dict]:
        return [{"fraction": float(f), "step": int(s), "tokens": float(t), "loss": float(l),
                 "lo": float(a), "hi": float(b)}
                for f, s, t, l, a, b in zip(self.fraction, self.step, self.tokens, self.loss,
                                            self.lo, self.hi, strict=True)]


def grid_fractions(target: Target, *, every: float = 0.01) -> np.ndarray:
    """Every 1% of the run, the target's eval steps, and the end."""
    n = int(round(1 / every))
    g = set(np.round(np.arange(1, n + 1) / n, 10).tolist())
    g.update(s / target.steps for s in target.eval_steps if 0 < s <= target.steps)
    g.add(1.0)
    return np.array(sorted(g))


def forecast(law, target: Target, *, level: float = 0.9, eval_noise: float = 0.0,
             every: float = 0.01) -> Forecast:
    """The target's forecast on :func:`grid_fractions`, its band from
    :func:`ladder.predict.band.target_band` (``eval_noise``: an eval's sd in metric units)."""
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    g = grid_fractions(target, every=every)
    # the band with the eval noise (the law's own band, the first pair, is not registered)
    loss, _, _, lo, hi = target_band(law, target.at(g), level=level, eval_noise=eval_noise)
    steps = np.rint(g * target.steps).astype(np.int64)
    final = {"loss": float(loss[-1]), "lo": float(lo[-1]), "hi": float(hi[-1])}
    return Forecast(fraction=g, step=steps, tokens=g * target.tokens, loss=loss, lo=lo, hi=hi,
                    final=final, level=level, eval_noise=float(eval_noise or 0.0))


def budget_curve(law, target: Target) -> dict:
    """The law's final metric if the run were given ``m`` x its planned tokens (decay re-aimed to
    the new end: fraction 1 of a run of that budget), for the contingency advisory."""
    m = np.array(BUDGET_MULTIPLIERS)
    loss, _, _ = law_band(law, {**target.at(m), "fraction": np.ones(m.shape)}, 0.9)
    return {"multiplier": m.tolist(), "tokens": (m * target.tokens).tolist(),
            "loss": loss.tolist()}


# ------------------------------------------------------------------------------------ ladder runs


@dataclass(frozen=True)
class LadderRun:
    """A finished ladder run read from its directory (for references and eval noise)."""

    path: str
    name: str
    steps: int
    rows: list


def read_ladder_runs(runs_dir: str | Path, *, include_targets: bool = False) -> list[LadderRun]:
    """Every run with metrics under ``runs_dir`` but target runs (unless asked) and diverged or
    failed ones: the references describe the healthy ladder, not the run being watched."""
    root = Path(runs_dir)
    if not root.exists():
        raise InputError("no such directory", path=root, field="--runs")
    out = []
    for run in read_runs(root):
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


HEALTH_KEYS = ("moe/drop_frac", "grad/norm", "moe/router_entropy", "moe/load_max_over_mean",
               "moe/router_z_loss")


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
    """How far (log units) a rung strays outside the envelope of the *other* rungs at the same
    fraction, worst case over rungs and fractions: leave-one-rung-out, since health signals
    differ between sizes (cpu ladder router entropy at 30%: 0.6 to 1.5 across rungs). ``m``: runs
    x bins of positive values; None per side with fewer than ``min_others`` + 1 runs."""
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
    each rung's median within +-``smooth``/2 of the bin centre, and the envelope's
    ``tolerance``. Parameter norms (``params/norm/<group>``, not router_bias) are relative to
    each rung's value at ``grad_after`` (their size grows with width: growth is compared)."""
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
            v = np.array([as_float(r.get(key)) for r in run.rows], dtype=float)  # None: NaN
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
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN bin: NaN
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
    """Robust z-score of each value against the ``window`` finite values before it: (x - trailing
    median) / (1.4826 x trailing MAD), the MAD the trailing median of the absolute deviations
    from the rolling median (robust to a loss curve's fall); NaN until two quarter windows are
    seen. It judges the target and calibrates ``spike_k`` on the ladder alike."""
    from ladder.predict.rolling import rolling_median
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
    """The largest robust z-score of ``key`` over the ladder's healthy runs (``spike_k`` is set
    above it)."""
    worst, n = None, 0
    for run in runs:
        x = np.array([as_float(r.get(key)) for r in run.rows], dtype=float)  # None: NaN
        with np.errstate(all="ignore"):
            z = spike_scores(x, window).z
        z = z[np.isfinite(z)]
        if z.size:
            n += 1
            worst = float(z.max()) if worst is None else max(worst, float(z.max()))
    return {"max_z": worst, "runs": n, "key": key, "window": window}
