"""Alerts, the severities and exit statuses, the watcher's state (:func:`new_state`) and the
hysteresis the health rules share (:func:`_level_signal`: a condition must hold for
``k_health`` rows to be raised and be gone for ``k_health_clear`` rows to clear).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from predict.watch.batch import Batch

SEVERITIES = ("info", "warn", "critical")


_SEV_RANK = {"info": 0, "warn": 1, "critical": 2}


@dataclass(frozen=True)
class Alert:
    """One alert (shared/DESIGN.md section 3, alerts.jsonl)."""

    time: str
    step: int | None
    tokens: float | None
    fraction: float | None
    kind: str
    severity: str
    value: float | None = None
    expected: float | None = None
    lo: float | None = None
    hi: float | None = None
    direction: str | None = None
    message: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity: must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("time", "step", "tokens", "fraction", "kind",
                                           "severity", "value", "expected", "lo", "hi",
                                           "direction", "message")}
        d.update(self.extra)
        return d

    def line(self) -> str:
        where = f"step {self.step}" if self.step is not None else "-"
        if self.fraction is not None:
            where += f" ({self.fraction:.1%})"
        return f"[{self.severity.upper():8}] {self.kind:<14} {where}: {self.message}"


def exit_code_for(worst: str | None, not_applicable: bool) -> int:
    """DESIGN.md section 4: 0 nothing above info, 1 warnings, 2 critical, 3 not applicable."""
    if not_applicable:
        return 3
    return {"warn": 1, "critical": 2}.get(worst or "info", 0)


@dataclass
class CheckResult:
    alerts: list[Alert]
    state: dict

    @property
    def worst(self) -> str | None:
        return self.state.get("worst")

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.state.get("worst"), bool(self.state.get("not_applicable")))


def new_state() -> dict:
    return {"schema": "watch-state/1", "last_step": None, "last_point_time": None,
            "n_points": 0, "n_evals": 0, "worst": None, "not_applicable": None,
            "band": {"ema": None, "run_dir": None, "run_len": 0, "far_len": 0, "in_len": 0,
                     "level": None, "direction": None, "contingency_sent": False},
            "trend": {"hist": [], "run_len": 0, "in_len": 0, "base": None, "dir": None},
            "rise": {"min": None, "run_len": 0, "in_len": 0, "active": False},
            "signals": {}, "tails": {}, "nan_reported": [], "stalled": False,
            "grad_min": None, "notes_seen": 0}


def _opt(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _level_signal(kind, key, sev, value, ref, b: Batch, frac, tokens, st, emit, stamp, cfg,
                  describe):
    """A health signal with hysteresis. ``sev`` per row: -1 unknown (skipped), 0 fine, 1 warn,
    2 critical. A level must hold for ``k_health`` judged rows to be raised (escalations alert),
    and be gone for ``k_health_clear`` rows to clear. Loops over runs of equal ``sev`` only."""
    s = st["signals"].setdefault(key, {"level": 0, "run_sev": None, "run_len": 0})
    judged = np.flatnonzero(sev >= 0)
    if not judged.size:
        return
    sv = sev[judged]
    starts = np.flatnonzero(np.concatenate([[True], sv[1:] != sv[:-1]]))
    ends = np.concatenate([starts[1:], [sv.size]])
    for a, e in zip(starts, ends, strict=True):
        level = int(sv[a])
        length = int(e - a)
        if s["run_sev"] == level:
            prior = s["run_len"]
        else:
            prior = 0
        total = prior + length
        s["run_sev"], s["run_len"] = level, total
        if level > s["level"]:
            if total >= cfg.k_health:
                at = judged[a + max(0, cfg.k_health - prior - 1)]
                s["level"] = level
                sev_name = "critical" if level == 2 else "warn"
                emit(Alert(stamp, int(b.step[at]), _opt(tokens[at]), _opt(frac[at]), kind,
                           sev_name, value=_opt(value[at]),
                           expected=None if ref is None else _opt(ref[at]),
                           direction="above" if kind != "router" else None,
                           message=describe(at, level) + f" ({key})", extra={"key": key}))
        elif level < s["level"]:
            need = cfg.k_health_clear if level == 0 else cfg.k_health
            if total >= need:
                at = judged[a + max(0, need - prior - 1)]
                old = s["level"]
                s["level"] = level
                if level == 0:
                    emit(Alert(stamp, int(b.step[at]), _opt(tokens[at]), _opt(frac[at]),
                               "cleared", "info", value=_opt(value[at]),
                               message=f"{key} back to normal for {need} rows (was {kind}, "
                                       f"{'critical' if old == 2 else 'warn'})",
                               extra={"key": key, "clears": kind}))
