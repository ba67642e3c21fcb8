"""A law asked about one planned run (issue 16: binding a law to a planned run is the
forecaster's job, not the fitter's). No JAX here.
"""

from __future__ import annotations

from ladder.fit.lr_schedules import NamedSchedule
from ladder.fit.prediction import Query


def rung_query(rung, schedule=None, *, step=None, fraction=None) -> Query:
    """The query of ``rung`` (a :class:`ladder.specs.Rung`) under ``schedule`` (default: the
    rung's own; e.g. ``dataclasses.replace(rung.schedule, decay_end=0.6)`` for a shortened
    plan) with its steps and peak LR, sized by the rung's params in its param convention, at
    ``step`` or ``fraction`` of the run."""
    p = rung.params
    return Query(params=p.total, active_params=p.active, step=step, fraction=fraction,
                 schedule=NamedSchedule.of_rung(rung, schedule))
