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


# The watcher state, field by field (issue 26: a state file is ours, but it is a file, edited or
# damaged or from another version, and its fields feed the rules). Kinds: "count" an int >= 0,
# "step?" an int in [0, 2**53] or null, "num?" a finite number or null, "bool", "str?",
# ("enum?", values), "strs" a list of strings, "nums" a list of finite numbers, and nested
# tables. Keys not listed are refused, except the rules' own per-key entries (``param_base/*``).
_SIGNAL = {"level": ("int", 0, 2), "run_sev": ("int?", -1, 2), "run_len": "count"}
_DIRS = ("above", "below")
STATE_FIELDS: dict = {
    "schema": "str?", "last_step": "step?", "last_point_time": "num?", "n_points": "count",
    "n_evals": "count", "worst": ("enum?", SEVERITIES), "not_applicable": "str?",
    "stalled": "bool", "grad_min": "num?", "notes_seen": "count", "nan_reported": "strs",
    "metric_seen": "bool", "missing_metric": "bool", "last_spike_step": "step?",
    "band": {"ema": "num?", "run_dir": ("enum?", _DIRS), "run_len": "count", "far_len": "count",
             "in_len": "count", "level": ("enum?", ("warn", "critical")),
             "direction": ("enum?", _DIRS), "contingency_sent": "bool"},
    "trend": {"hist": "pairs", "run_len": "count", "in_len": "count", "base": "num?",
              "dir": "str?"},
    "rise": {"min": "num?", "run_len": "count", "in_len": "count", "active": "bool"},
    "signals": ("map", _SIGNAL),
    "tails": ("map", "nums"),
}
_STATE_PREFIXES = {"param_base/": "num?"}
_MAX_COUNT = 2 ** 53


def check_state(st, where: str = "state") -> dict:
    """``st`` when it is a watcher state as :func:`new_state` and the rules write it (the fields
    of :data:`STATE_FIELDS`); a ValueError naming the first bad field (``state.band.run_len:
    ...``) otherwise. Missing fields take :func:`new_state`'s values."""
    if not isinstance(st, dict):
        raise ValueError(f"{where}: expected an object, got {type(st).__name__}")
    for k, v in st.items():
        spec = STATE_FIELDS.get(k)
        if spec is None:
            spec = next((s for p, s in _STATE_PREFIXES.items()
                         if isinstance(k, str) and k.startswith(p)), None)
        if spec is None:
            raise ValueError(f"{where}.{k}: unknown field of a watcher state")
        _check_field(v, spec, f"{where}.{k}")
    fresh = new_state()
    return {**fresh, **st}


def _check_field(v, spec, where: str) -> None:
    def bad(want):
        raise ValueError(f"{where}: expected {want}, got {str(v)[:40]!r}")

    def finite(x):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        try:
            return math.isfinite(x)
        except OverflowError:  # an integer beyond float range
            return False

    if isinstance(spec, dict):
        if not isinstance(v, dict):
            bad("an object")
        for k, x in v.items():
            if k not in spec:
                raise ValueError(f"{where}.{k}: unknown field of a watcher state")
            _check_field(x, spec[k], f"{where}.{k}")
    elif isinstance(spec, tuple) and spec[0] == "map":
        if not isinstance(v, dict):
            bad("an object")
        for k, x in v.items():
            _check_field(x, spec[1], f"{where}.{k}")
    elif isinstance(spec, tuple) and spec[0] == "enum?":
        if v is not None and v not in spec[1]:
            bad(f"one of {', '.join(spec[1])} or null")
    elif isinstance(spec, tuple):  # ("int", lo, hi) / ("int?", lo, hi)
        kind, lo, hi = spec
        if v is None and kind == "int?":
            return
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            bad(f"an integer in [{lo}, {hi}]")
    elif spec == "count":
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_COUNT:
            bad("an integer >= 0")
    elif spec == "step?":
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or
                              not 0 <= v <= _MAX_COUNT):
            bad("a step (an integer >= 0) or null")
    elif spec == "num?":
        if v is not None and not finite(v):
            bad("a finite number or null")
    elif spec == "bool":
        if not isinstance(v, bool):
            bad("true or false")
    elif spec == "str?":
        if v is not None and not isinstance(v, str):
            bad("a string or null")
    elif spec == "strs":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            bad("a list of strings")
    elif spec == "nums":
        if not isinstance(v, list) or not all(finite(x) for x in v):
            bad("a list of finite numbers")
    elif spec == "pairs":
        if not isinstance(v, list) or not all(isinstance(x, list) and len(x) == 2 and
                                              all(finite(y) for y in x) for x in v):
            bad("a list of [fraction, value] pairs of finite numbers")
    else:  # a spec this function does not know: a bug here, not in the file
        raise AssertionError(f"unknown state spec {spec!r} at {where}")


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
