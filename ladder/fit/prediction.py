"""What every fitted law answers: the ``Law`` protocol, the one question ``Query`` and the one
answer ``Prediction`` (``loss``, ``lo``, ``hi`` in metric units, the band at ``level``); every
law is asked ``law.predict(Query(...))`` or with the query's fields as keywords. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Query:
    """Where a law is asked; every field optional, arrays broadcast. ``params``,
    ``active_params``: the model's size; ``tokens``, ``compute``: so far at the point;
    ``fraction``: progress through the planned run; ``schedule`` (curve laws): the LR of every
    update, a fit.lr_schedules.NamedSchedule or ``kind:steps=..,peak=..``; ``step``: completed
    steps along it. A law reads the fields its form needs and names one that is missing."""

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
        out = {k: np.asarray(v).tolist() for k, v in (("step", self.step),
                                                      ("fraction", self.fraction))
               if v is not None}
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
    """A fitted law of any form, implemented once by fit.result.LawResult: ``predict`` a
    :class:`Query` to a :class:`Prediction` at ``level``, ``band`` alone, ``to_json`` (law.json,
    read back by LawResult.from_json)."""

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
