"""Alerts, the severities and exit statuses, and what ``check`` returns (:class:`CheckResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ladder.io import as_float

SEVERITIES = ("info", "warn", "critical")
SEVERITY_RANK = {"info": 0, "warn": 1, "critical": 2}
# an alert's fields (shared/DESIGN.md section 3, alerts.jsonl), in the order they are written
FIELDS = ("time", "step", "tokens", "fraction", "kind", "severity", "value", "expected", "lo",
          "hi", "direction", "message")


@dataclass(frozen=True)
class Alert:
    """One alert; ``extra`` holds the fields a rule adds (written after :data:`FIELDS`)."""

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
        return {**{k: getattr(self, k) for k in FIELDS}, **self.extra}

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
    def exit_code(self) -> int:
        return exit_code_for(self.state.get("worst"), bool(self.state.get("not_applicable")))


def finite_or_none(x) -> float | None:
    """``x`` as a float (``ladder.io.as_float``), None when it is not a finite number."""
    x = as_float(x)
    return x if x is not None and math.isfinite(x) else None


def float_or_nan(x) -> float:
    """``x`` as a float (``ladder.io.as_float``), NaN when it is not a number."""
    x = as_float(x)
    return math.nan if x is None else x
