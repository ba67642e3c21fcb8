"""What every fitted law answers: the ``Law`` protocol and its one result type ``Prediction``.

A Chinchilla-family law (fit.law) predicts at points (``step``/``fraction`` unset); a curve law
(fit.curve_law) predicts along a run's schedule and fills ``step`` and ``fraction``. ``loss``,
``lo`` and ``hi`` are in metric units; the band is at ``level``. No dependencies beyond numpy,
so fit.law, fit.curve_law and reports can all import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Prediction:
    loss: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    level: float
    step: np.ndarray | None = None       # curve laws: the steps predicted
    fraction: np.ndarray | None = None   # curve laws: step / planned steps

    def to_dict(self) -> dict:
        def one(a):
            a = np.asarray(a, dtype=float)
            return float(a) if a.ndim == 0 else a.tolist()
        out = {}
        if self.step is not None:
            out["step"] = np.asarray(self.step).tolist()
        if self.fraction is not None:
            out["fraction"] = np.asarray(self.fraction).tolist()
        out.update(loss=one(self.loss), lo=one(self.lo), hi=one(self.hi), level=self.level)
        return out

    def to_csv(self) -> str:
        """step,loss,lo,hi lines (curve predictions: one row per step)."""
        if self.step is None:
            raise ValueError("step: to_csv needs a prediction along steps (a curve law's)")

        def f(x):
            return "nan" if not np.isfinite(x) else f"{x:.8g}"
        lines = ["step,loss,lo,hi"]
        lines += [f"{int(s)},{f(a)},{f(b)},{f(c)}"
                  for s, a, b, c in zip(self.step, self.loss, self.lo, self.hi, strict=True)]
        return "\n".join(lines) + "\n"


@runtime_checkable
class Law(Protocol):
    """A fitted law of any form, implemented once by fit.result.LawResult, whose two kinds are
    fit.result.FitResult (Chinchilla family: compute, chinchilla, moe, trajectory) and
    fit.curve_law.CurveLaw (schedule-aware curves: mpl, momentum).

    ``predict`` takes keyword inputs (a Chinchilla-family law: params, active_params, tokens,
    compute, fraction; a curve law: its LR schedule, bound to a planned run by
    predict.planned.ScheduledLaw) and returns a :class:`Prediction` with its band at ``level``;
    ``band`` is that band alone. ``to_json`` writes law.json (schema law/1, keyed by ``form``;
    read back by fit.law.law_from_json = LawResult.from_json), whose
    ``uncertainty.band_method`` names ``band_method``."""

    @property
    def form(self) -> str: ...

    @property
    def metric(self) -> str | None: ...

    @property
    def params(self) -> dict: ...

    @property
    def band_method(self) -> str: ...

    def predict(self, **inputs) -> Prediction: ...

    def band(self, **inputs) -> tuple[np.ndarray, np.ndarray]: ...

    def report(self) -> str: ...

    def to_json(self) -> dict: ...
