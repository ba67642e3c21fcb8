"""Learning-rate sequences for the curve laws (fit.curve_forms), which need the LR of *every*
update: ``lr[s - 1]`` is the LR of update ``s`` (1-based); the loss at completed step ``t`` has
seen updates ``1..t``.

Sources: a named schedule (``linear:steps=1000,peak=3e-3,warmup=0.01,min=0.05,decay_end=0.6``),
built as the trainer builds it; a CSV of ``step, lr``; a points table's ``step, lr``. Sampled LRs
are interpolated linearly (exact for piecewise-linear schedules whose kinks are sampled), rising
from 0 at step 0 before the first sample (a linear warmup) and held after the last.
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
    """A :class:`Schedule` with its length and peak LR; ``tokens_per_step`` (a planned run's):
    a curve law then reads tokens so far as the run's length."""

    schedule: Schedule
    steps: int
    peak: float
    tokens_per_step: float | None = None

    @classmethod
    def of_rung(cls, rung, schedule: Schedule | None = None) -> NamedSchedule:
        """The planned run of ``rung`` (with ``schedule`` in place of its own, if given)."""
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
    """LR of updates 1..steps: the trainer's own table (ladder.lrtable)."""
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
    # 10**8 steps: 256x the hero's; the table is built step by step, so a typo would hang
    if not math.isfinite(steps) or steps != int(steps) or steps <= 0 or steps > 10**8:
        raise InputError(f"schedule steps must be a positive integer <= 1e8, got "
                         f"{values['steps']}", field=field)
    try:
        return NamedSchedule(Schedule(kind=kind, **nums), int(steps), peak)
    except ValueError as e:
        raise InputError(f"bad schedule ({e})", field=field) from None


def lr_from_samples(step, lr, *, until: int | None = None, what: str = "lr") -> np.ndarray:
    """Full per-update LR sequence (``until`` long, default the last sampled step) from LRs
    sampled at completed steps (module doc)."""
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
    """``(sampled steps, per-update LRs up to the last)`` from a CSV of ``step, lr``."""
    import pandas as pd

    from ladder.io import read_table

    path = Path(path)
    df = read_table(path, field="--schedule")  # a directory, unreadable, not a CSV: one line
    for col in ("step", "lr"):
        if col not in df.columns:
            raise InputError("missing column", path=path, field=col)
    step, lr = (pd.to_numeric(df[c], errors="coerce").to_numpy(float) for c in ("step", "lr"))
    for col, v in (("step", step), ("lr", lr)):
        if not np.all(np.isfinite(v)):
            raise InputError(f"non-numeric or missing {col}", path=path, field=col)
    if np.any(step > 10**8):  # the LR table is per step (see parse_schedule's limit)
        raise InputError("steps beyond 1e8", path=path, field="step")
    try:
        seq = lr_from_samples(step, lr)
    except InputError as e:
        raise InputError(str(e).split(": ", 1)[-1], path=path, field=e.field) from None
    return np.unique(step.astype(int)), seq


def schedule_source(text: str) -> tuple[np.ndarray | None, np.ndarray]:
    """``--schedule`` -> ``(steps to report or None, LR sequence)``: a CSV file, else a name."""
    if Path(text).exists() or text.lower().endswith(".csv"):
        return read_schedule_csv(text)
    return None, parse_schedule(text).lr()
