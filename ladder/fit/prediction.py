"""What every fitted law answers: the ``Law`` protocol, the one question ``Query`` and the one
answer ``Prediction``.

Every law is asked the same way, ``law.predict(Query(...), level=...)`` (or the query's fields
as keywords, ``law.predict(compute=..., fraction=...)``: the same query). A Chinchilla-family
law (ladder.fit.result.FitResult) reads the points' sizes, tokens, compute and fraction; a curve law
(ladder.fit.curve_law.CurveLaw) reads the planned run's LR ``schedule``, where along it (``step`` or
``fraction``) and its size, and fills the prediction's ``step`` and ``fraction``. ``loss``,
``lo`` and ``hi`` are in metric units; the band is at ``level``. No dependencies beyond numpy,
so ladder.fit.law, ladder.fit.curve_law and reports can all import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Query:
    """Where a law is asked; every field optional, arrays broadcast. ``params``,
    ``active_params``: the model's size; ``tokens``, ``compute``: so far at the point (the
    points-table convention); ``fraction``: progress through the planned run; ``schedule``: the
    planned run's LR schedule (curve laws: the LR of every update as an array, ``lr[s-1]`` for
    update ``s``, a ladder.fit.lr_schedules.NamedSchedule, or its text ``kind:steps=..,peak=..``; a
    NamedSchedule with ``tokens_per_step`` also reads ``tokens`` as tokens so far, so that a
    different budget is the same schedule shape stretched to it); ``step``: completed steps
    along the schedule (curve laws; else ``fraction`` of it, default every 1%). A law reads the
    fields its form needs and says which one is missing (fit.result, fit.curve_law)."""

    params: Any = None
    active_params: Any = None
    tokens: Any = None
    compute: Any = None
    fraction: Any = None
    schedule: Any = None
    step: Any = None

    @classmethod
    def of(cls, query: Query | None = None, **given) -> Query:
        """``query``, or the query of the keywords ``given`` (its fields; not both)."""
        if query is None:
            return cls(**given)
        if not isinstance(query, Query):
            raise TypeError(f"query: expected a Query, got {type(query).__name__}")
        if given:
            raise TypeError(f"query: give a Query or its fields, not both ({sorted(given)})")
        return query


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
    ladder.fit.result.FitResult (Chinchilla family: compute, chinchilla, moe, trajectory) and
    ladder.fit.curve_law.CurveLaw (schedule-aware curves: mpl, momentum).

    ``predict`` takes a :class:`Query` (or its fields as keywords) and returns a
    :class:`Prediction` with its band at ``level``, whatever the form; ``band`` is that band
    alone. ``to_json`` writes law.json (schema law/3, keyed by ``form``;
    read back by ladder.fit.law.law_from_json = LawResult.from_json), whose
    ``uncertainty.band_method`` names ``band_method``."""

    @property
    def form(self) -> str: ...

    @property
    def metric(self) -> str | None: ...

    @property
    def params(self) -> dict: ...

    @property
    def band_method(self) -> str: ...

    def predict(self, query: Query | None = None, /, *, level: float | None = None,
                **fields) -> Prediction: ...

    def band(self, query: Query | None = None, /, **fields) -> tuple[np.ndarray, np.ndarray]: ...

    def report(self) -> str: ...

    def to_json(self) -> dict: ...
