"""Learning-rate sequences for the schedule-aware curve laws (``ladder.fit.curve_forms``).

A curve law needs the LR of *every* update, not only at the logged steps. Convention used
throughout: ``lr[s - 1]`` is the LR of update ``s`` (1-based), i.e. the update that completes step
``s``; the loss logged at completed step ``t`` has seen updates ``1..t``.

Three sources:
- a named schedule (``linear:steps=1000,peak=3e-3,warmup=0.01,min=0.05,decay_end=0.6``), built from
  :class:`ladder.specs.Schedule` exactly as the trainer does (update ``s`` uses
  ``Schedule.lr_frac(s - 1, steps)``);
- a CSV with columns ``step, lr`` (possibly sampled every few steps);
- the ``step, lr`` columns of a points table.
Sampled LRs are linearly interpolated between samples; before the first sample the LR is taken to
rise linearly from 0 at step 0 (a linear warmup, the usual case and what every ladder here uses),
and after the last sample it stays at the last value. Linear interpolation is exact for the
piecewise-linear schedules (linear, WSD with linear decay, constant) whenever the kinks are
sampled, and off by at most one sampling interval's smear for a step change.

Plain numpy; no JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ladder.io import InputError
from ladder.lrtable import lr_table
from ladder.specs import SCHEDULES, Schedule

# Named-schedule keys -> Schedule field (or the two extra keys, steps and peak).
_KEYS = {"steps": "steps", "peak": "peak", "warmup": "warmup", "min": "min_lr_frac",
         "min_lr_frac": "min_lr_frac", "decay": "decay", "decay_end": "decay_end"}


@dataclass(frozen=True)
class NamedSchedule:
    """A :class:`Schedule` with its length and peak LR: enough to give the LR of every update.
    ``tokens_per_step`` (a planned run's, :meth:`of_rung`): a curve law then reads tokens so far
    as the run's length (ladder.fit.prediction.Query)."""

    schedule: Schedule
    steps: int
    peak: float
    tokens_per_step: float | None = None

    @classmethod
    def of_rung(cls, rung, schedule: Schedule | None = None) -> NamedSchedule:
        """The planned run of ``rung`` (a :class:`ladder.specs.Rung`): its schedule (or
        ``schedule``, e.g. ``dataclasses.replace(rung.schedule, decay_end=0.6)`` for a
        shortened plan), steps, peak LR and tokens per step."""
        return cls(rung.schedule if schedule is None else schedule, int(rung.steps),
                   float(rung.peak_lr), float(rung.tokens_per_step))

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps <= 0:
            raise ValueError(f"steps: must be a positive integer, got {self.steps!r}")
        if not (np.isfinite(self.peak) and self.peak > 0):
            raise ValueError(f"peak: must be > 0, got {self.peak!r}")

    def lr(self) -> np.ndarray:
        return lr_from_schedule(self.schedule, self.steps, self.peak)


def lr_from_schedule(schedule: Schedule, steps: int, peak: float) -> np.ndarray:
    """LR of updates 1..steps (``lr[s-1]`` for update ``s``): the trainer's own table
    (:func:`ladder.lrtable.lr_table`)."""
    return lr_table(schedule, steps, peak)


def parse_schedule(text: str, *, field: str = "--schedule") -> NamedSchedule:
    """Parse ``KIND:key=value,...``; KIND in linear|wsd|cosine|constant; ``steps`` and ``peak``
    are required, the others default as in :class:`ladder.specs.Schedule`."""
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if kind not in SCHEDULES:
        raise InputError(f"schedule kind must be one of {SCHEDULES} (or a CSV file), got {kind!r}",
                         field=field)
    values: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))) if sep else ():
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _KEYS:
            raise InputError(f"bad schedule item {item!r}; keys are {sorted(_KEYS)}", field=field)
        if _KEYS[key] in values:
            raise InputError(f"schedule key {key!r} given twice", field=field)
        values[_KEYS[key]] = value.strip()
    for need in ("steps", "peak"):
        if need not in values:
            raise InputError(f"named schedule needs '{need}=...'", field=field)
    try:
        nums = {k: float(v) for k, v in values.items()}
    except ValueError as e:
        raise InputError(f"schedule value is not a number ({e})", field=field) from None
    steps = nums.pop("steps")
    peak = nums.pop("peak")
    # 10**8 steps: 256x the hero's 390,251; the LR table is built step by step, so a larger
    # (typo'd) count would hang rather than fail
    if not math.isfinite(steps) or steps != int(steps) or steps <= 0 or steps > 10**8:
        raise InputError(f"schedule steps must be a positive integer <= 1e8, got "
                         f"{values['steps']}",
                         field=field)
    try:
        return NamedSchedule(Schedule(kind=kind, **nums), int(steps), peak)
    except ValueError as e:
        raise InputError(f"bad schedule ({e})", field=field) from None


def lr_from_samples(step, lr, *, until: int | None = None, what: str = "lr") -> np.ndarray:
    """Full per-update LR sequence from LRs sampled at some completed steps (see module doc).

    ``until`` (default: the last sampled step) is the length of the returned sequence.
    Raises :class:`InputError` on repeated steps with different LRs, negative or non-finite LRs.
    """
    step = np.asarray(step, dtype=float)
    lr = np.asarray(lr, dtype=float)
    ok = np.isfinite(step) & np.isfinite(lr)
    step, lr = step[ok], lr[ok]
    if step.size == 0:
        raise InputError("no finite (step, lr) pairs", field=what)
    if np.any(step < 1) or np.any(step != np.round(step)):
        raise InputError("steps must be integers >= 1 (completed steps)", field="step")
    if np.any(lr < 0):
        raise InputError("learning rates must be >= 0", field=what)
    order = np.argsort(step, kind="stable")
    step, lr = step[order], lr[order]
    uniq, first = np.unique(step, return_index=True)
    if uniq.size != step.size:
        # a repeated step (e.g. a restart) must agree on its LR; then keep one
        last = np.r_[first[1:], step.size] - 1
        if np.any(np.abs(lr[first] - lr[last]) > 1e-12 * np.maximum(1.0, np.abs(lr[first]))):
            raise InputError("a step is repeated with different learning rates", field=what)
        step, lr = uniq, lr[first]
    n = int(step[-1]) if until is None else int(until)
    if n < 1:
        raise InputError("schedule has no steps", field=what)
    grid = np.arange(1, n + 1, dtype=float)
    # warmup assumption: LR 0 at step 0 unless step 1 is sampled
    xs = np.r_[0.0, step] if step[0] > 1 else step
    ys = np.r_[0.0, lr] if step[0] > 1 else lr
    return np.interp(grid, xs, ys)


def read_schedule_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, lr)`` from a CSV with columns ``step, lr``: the sampled steps (to predict at) and
    the full per-update LR sequence up to the last of them."""
    import pandas as pd

    from ladder.io import read_table

    path = Path(path)
    df = read_table(path, field="--schedule")  # a directory, unreadable, not a CSV: one line
    for col in ("step", "lr"):
        if col not in df.columns:
            raise InputError("missing column", path=path, field=col)
    step = pd.to_numeric(df["step"], errors="coerce").to_numpy(float)
    lr = pd.to_numeric(df["lr"], errors="coerce").to_numpy(float)
    if not np.all(np.isfinite(step)):
        raise InputError("non-numeric or missing step", path=path, field="step")
    if not np.all(np.isfinite(lr)):
        raise InputError("non-numeric or missing lr", path=path, field="lr")
    if np.any(step > 10**8):  # the LR table is per step (see parse_schedule's limit)
        raise InputError("steps beyond 1e8", path=path, field="step")
    try:
        seq = lr_from_samples(step, lr)
    except InputError as e:
        raise InputError(str(e).split(": ", 1)[-1], path=path, field=e.field) from None
    return np.unique(step.astype(int)), seq


def schedule_source(text: str) -> tuple[np.ndarray | None, np.ndarray]:
    """``--schedule`` argument -> ``(steps to report or None for the default grid, lr sequence)``.
    A value naming an existing file (or ending in .csv) is a CSV; anything else a named schedule."""
    if Path(text).exists() or text.lower().endswith(".csv"):
        return read_schedule_csv(text)
    return None, parse_schedule(text).lr()
