"""A law bound to one planned run, and the contingency projection (issue 16: binding a law to a
planned run is the forecaster's job, not the fitter's).

- :func:`predict_rung`: a schedule-aware curve law (fit.curve_law) along a rung's LR schedule.
- :class:`ScheduledLaw`: a curve law bound to a rung, answering the points-table call
  ``predict(params=, active_params=, tokens=, compute=, fraction=, level=)`` the forecaster makes
  of every law (:mod:`predict.forecast`).
- :func:`contingency_forecast`: the real hero's contingency, "continue as planned" against
  "shorten the run and re-aim the LR decay", as two final losses with bands.

No JAX here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fit.curve_law import CurveLaw
from fit.lr_schedules import lr_from_schedule
from fit.prediction import Prediction
from ladder.io import InputError


def predict_rung(law: CurveLaw, rung, schedule=None, *, level: float | None = None,
                 at_steps=None, fraction=None) -> Prediction:
    """The curve of ``rung`` (a :class:`ladder.specs.Rung`) under ``schedule`` (default: the
    rung's own; e.g. ``dataclasses.replace(rung.schedule, decay_end=0.6)`` for a shortened
    plan), its steps and peak LR, sized by the rung's params in its param convention."""
    sched = rung.schedule if schedule is None else schedule
    lr = lr_from_schedule(sched, rung.steps, rung.peak_lr)
    p = rung.params
    return law.predict(lr=lr, at_steps=at_steps, fraction=fraction, params=p.total,
                       active_params=p.active, level=level)


@dataclass(frozen=True)
class ScheduledLaw:
    """A curve law bound to one planned run (a rung and its LR schedule).

    It answers the points-table style call the forecaster makes of every law,
    ``predict(params=, active_params=, tokens=, compute=, fraction=, level=)``: ``fraction`` is
    progress through the planned run; ``tokens``, when given, is read as tokens so far, so that
    ``tokens / fraction`` is the run's total budget and a different budget means the same schedule
    shape stretched to that many steps (the contingency "shorten the run, re-aim the decay").
    """

    law: CurveLaw
    rung: Any
    schedule: Any = None  # a ladder.specs.Schedule; None = the rung's own

    @property
    def form(self) -> str:
        return self.law.form

    @property
    def metric(self) -> str | None:
        return self.law.metric

    @property
    def params(self) -> dict[str, float]:
        return self.law.params

    def to_json(self) -> dict:
        return self.law.to_json()

    def predict(self, *, fraction=None, tokens=None, level: float | None = None,
                **_sizes) -> Prediction:
        g = np.atleast_1d(np.asarray(1.0 if fraction is None else fraction, float))
        steps = np.full(g.shape, self.rung.steps, dtype=np.int64)
        if tokens is not None:
            total = np.broadcast_to(np.asarray(tokens, float), g.shape) / np.maximum(g, 1e-12)
            steps = np.maximum(1, np.rint(total / self.rung.tokens_per_step)).astype(np.int64)
        loss, lo, hi = (np.full(g.shape, np.nan) for _ in range(3))
        step_out = np.zeros(g.shape, dtype=np.int64)
        pred = None
        for n in np.unique(steps):
            idx = np.flatnonzero(steps == n)
            pred = predict_rung(self.law, dataclasses.replace(self.rung, steps=int(n)),
                                self.schedule, level=level, fraction=g[idx])
            loss[idx], lo[idx], hi[idx], step_out[idx] = pred.loss, pred.lo, pred.hi, pred.step
        return Prediction(step=step_out, fraction=g, loss=loss, lo=lo, hi=hi,
                               level=float(pred.level if pred is not None else level or 0.9))


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
        pred = predict_rung(law, rung, sched, level=level, at_steps=[steps])
        out.append(PlanForecast(steps=int(steps), tokens=int(steps * rung.tokens_per_step),
                                decay_end=float(sched.decay_end), loss=float(pred.loss[0]),
                                lo=float(pred.lo[0]), hi=float(pred.hi[0])))
    return ContingencyForecast(out[0], out[1], float(pred.level))
