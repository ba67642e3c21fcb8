"""A law asked about one planned run, and the contingency projection (issue 16: binding a law to
a planned run is the forecaster's job, not the fitter's).

- :func:`rung_query`: the question a law is asked about a rung (fit.prediction.Query: its size
  and its planned LR schedule), and :func:`predict_rung`, a law's answer along it.
- :func:`contingency_forecast`: the real hero's contingency, "continue as planned" against
  "shorten the run and re-aim the LR decay", as two final losses with bands.

No JAX here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ladder.fit.curve_law import CurveLaw
from ladder.fit.lr_schedules import NamedSchedule
from ladder.fit.prediction import Prediction, Query
from ladder.io import InputError


def rung_query(rung, schedule=None, *, step=None, fraction=None) -> Query:
    """The query of ``rung`` (a :class:`ladder.specs.Rung`) under ``schedule`` (default: the
    rung's own; e.g. ``dataclasses.replace(rung.schedule, decay_end=0.6)`` for a shortened
    plan) with its steps and peak LR, sized by the rung's params in its param convention, at
    ``step`` or ``fraction`` of the run."""
    p = rung.params
    return Query(params=p.total, active_params=p.active, step=step, fraction=fraction,
                 schedule=NamedSchedule.of_rung(rung, schedule))


def predict_rung(law, rung, schedule=None, *, level: float | None = None, step=None,
                 fraction=None) -> Prediction:
    """The law along ``rung`` (:func:`rung_query`)."""
    return law.predict(rung_query(rung, schedule, step=step, fraction=fraction), level=level)


@dataclass(frozen=True)
class PlanForecast:
    """Final loss (with band) of one plan for a run: its length and where the prediction ends."""

    steps: int
    tokens: int
    decay_end: float
    loss: float
    lo: float
    hi: float


@dataclass(frozen=True)
class ContingencyForecast:
    """"Continue as planned" vs "shorten and re-aim the decay" (the real hero's contingency:
    trouble within the first 25% of tokens -> shorten the run and re-aim the LR decay)."""

    planned: PlanForecast
    shortened: PlanForecast
    level: float

    def to_dict(self) -> dict:
        return {"planned": dataclasses.asdict(self.planned),
                "shortened": dataclasses.asdict(self.shortened), "level": self.level}


def contingency_forecast(law: CurveLaw, rung, decay_end: float, *,
                         level: float | None = None) -> ContingencyForecast:
    """Projected final loss of ``rung`` as planned and when shortened to ``decay_end`` of its
    planned steps with the decay re-aimed to end there (``Schedule.decay_end``)."""
    if not 0 < decay_end <= 1:
        raise InputError(f"must be in (0, 1], got {decay_end!r}", field="decay_end")
    short_sched = dataclasses.replace(rung.schedule, decay_end=float(decay_end))
    short_steps = max(1, round(decay_end * rung.steps))
    out = []
    for sched, steps in ((rung.schedule, rung.steps), (short_sched, short_steps)):
        pred = predict_rung(law, rung, sched, level=level, step=[steps])
        out.append(PlanForecast(steps=int(steps), tokens=int(steps * rung.tokens_per_step),
                                decay_end=float(sched.decay_end), loss=float(pred.loss[0]),
                                lo=float(pred.lo[0]), hi=float(pred.hi[0])))
    return ContingencyForecast(out[0], out[1], float(pred.level))
