"""Leave-one-rung-out calibration of the forecast band (ladder.predict.band): refit without one
rung and count how many of its points fall inside the band (a 90% band should hold about 90%).
Used by bench/watch_quality.py and tests/test_predict_forecast.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ladder.io import InputError
from ladder.predict.band import target_band


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


def leave_one_rung_out(points, fit_fn: Callable[[Any], Any], *, level: float = 0.9,
                       eval_noise: float = 0.0, min_fraction: float = 0.01,
                       runs: Iterable[str] | None = None) -> Calibration:
    """Refit without each rung (``fit_fn(points_without_it) -> law``) and score its points
    (``points``: a table with ``run, params, active_params, tokens, compute, fraction, loss``)
    from ``min_fraction`` on, as the watcher compares them."""
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
        loss, lo0, hi0, lo, hi = target_band(law, inputs, level=level, eval_noise=eval_noise)
        y = test["loss"].to_numpy(float)
        has = np.isfinite(lo) & np.isfinite(hi)
        inside = has & (y >= lo) & (y <= hi)
        out.append(RungCoverage(run=str(run), n=len(y), inside=int(inside.sum()),
                                above=int((has & (y > hi)).sum()),
                                below=int((has & (y < lo)).sum()), missing=int((~has).sum()),
                                mean_rel_error=float(np.mean(np.abs(loss / y - 1))),
                                inside_law_only=int((has & (y >= lo0) & (y <= hi0)).sum())))
    return Calibration(level=level, rungs=tuple(out))
