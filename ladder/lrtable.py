"""The LR table: the learning rate of every update of a run, the one place it is built.

The trainer steps with :func:`run_lr_table` and the schedule-aware curve laws read it
(:meth:`sources.runs.RunDir.lr_table`), so the LRs a run trained with and those a law is fitted
on cannot drift apart. Entry ``i`` is the LR of 0-based update ``i``: ``peak x
Schedule.lr_frac(i, steps)``, times the ``lr-spike`` demo fault's scale from ``spike_at`` on.
"""

from __future__ import annotations

import numpy as np

LR_SPIKE = "lr-spike"     # the trainer's fault that multiplies the LR (trainconfig.FAULTS)
SPIKE_AT = 0.5            # default: from half of the planned steps on (TrainConfig.fault_at)
SPIKE_SCALE = 10.0        # default LR multiplier (TrainConfig.fault_scale): a visible jump


def spike_step(steps: int, at: float) -> int:
    """First (0-based) update a fault starting at fraction ``at`` of ``steps`` affects."""
    return round(at * steps)


def lr_table(schedule, steps: int, peak_lr: float, *, spike_at: int | None = None,
             spike_scale: float = SPIKE_SCALE) -> np.ndarray:
    """Float64 LR of updates ``0..steps-1`` under ``schedule`` (a :class:`ladder.specs.Schedule`)
    at peak ``peak_lr``; updates from ``spike_at`` on (the lr-spike fault) times ``spike_scale``."""
    frac = np.array([schedule.lr_frac(i, steps) for i in range(steps)], np.float64)
    lr = peak_lr * frac
    if spike_at is not None:
        lr[spike_at:] *= spike_scale
    return lr


def run_lr_table(rung, train: dict | None) -> np.ndarray:
    """The float64 LR table of a run: ``rung`` (a :class:`ladder.specs.Rung`, as it ran) and the
    ``train`` section of its ``config.json`` (``TrainConfig.to_dict()``: ``fault``, ``fault_at``,
    ``fault_scale``; a missing ``fault_at``/``fault_scale`` takes the trainer's default)."""
    train = train or {}
    spike = None
    if train.get("fault") == LR_SPIKE:
        spike = spike_step(rung.steps, float(train.get("fault_at", SPIKE_AT)))
    return lr_table(rung.schedule, rung.steps, rung.peak_lr, spike_at=spike,
                    spike_scale=float(train.get("fault_scale", SPIKE_SCALE)))
