"""The watcher state, derived from the rules: the fields the judge itself keeps (where the run
is, what was judged, the worst severity, whether the forecast still applies) and one section per
rule that keeps a state (``RULES``: its ``State`` under its ``key``).

``check`` reads a state (:meth:`WatchState.read`), judges with the rules' typed states and
writes it back (:meth:`WatchState.to_json`): the state passed in and out of ``check`` and kept
in the state file is JSON. One reader per version: ``watch-state/2`` (:data:`SCHEMA`, this
layout) and ``watch-state/1`` (one nested dict: the band's, trend's and rising rule's tables,
the health signals and trailing values by metric key, and loose fields; read into this layout,
so a watcher restarted on an old state repeats no alert). A bad field is a ValueError naming it
(``state.band.run_len: expected an integer >= 0, got '-1'``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ladder.predict.watch.alerts import SEVERITIES
from ladder.predict.watch.rules import RULES
from ladder.predict.watch.rules.base import RuleState, kept, read_field

SCHEMA = "watch-state/2"
SCHEMA_V1 = "watch-state/1"


def _sections() -> dict:
    return {r.key: r.new_state() for r in RULES if r.State is not None}


@dataclass
class WatchState(RuleState):
    """The judge's own fields and (``sections``) each rule's typed state by its key."""

    last_step: int | None = kept("step?")
    last_point_time: float | None = kept("num?")
    n_points: int = kept("count", 0)
    n_evals: int = kept("count", 0)
    worst: str | None = kept(("enum?", SEVERITIES))
    not_applicable: str | None = kept("str?")
    sections: dict = field(default_factory=_sections, metadata={"spec": None})

    def of(self, rule) -> RuleState:
        """``rule``'s own state."""
        return self.sections[rule.key]

    def to_json(self) -> dict:
        out = {"schema": SCHEMA}
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name != "sections"})
        out.update({k: s.to_json() for k, s in self.sections.items()})
        return out

    @classmethod
    def read(cls, d, where: str = "state") -> WatchState:
        """A state of either version (a dict without a schema: the first layout)."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        schema = d.get("schema", SCHEMA_V1)
        if schema == SCHEMA:
            return cls.from_json(d, where)
        if schema == SCHEMA_V1:
            return cls.from_json(_v2_of_v1(d, where), where)
        raise ValueError(f"{where}.schema: expected {SCHEMA!r} or {SCHEMA_V1!r}, got "
                         f"{str(schema)[:40]!r}")

    @classmethod
    def from_json(cls, d, where: str = "state") -> WatchState:
        """A ``watch-state/2`` state; missing fields and sections take their defaults."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        own = {k: v for k, v in d.items() if k != "schema" and k not in _SECTIONS}
        if "sections" in own:
            raise ValueError(f"{where}.sections: unknown field of a watcher state")
        st = super().from_json(own, where)
        for k, v in d.items():
            if k in _SECTIONS:
                st.sections[k] = _SECTIONS[k].from_json(v, f"{where}.{k}")
        return st


_SECTIONS = {r.key: r.State for r in RULES if r.State is not None}


def new_state() -> dict:
    """A fresh state, as ``check`` takes and returns it."""
    return WatchState().to_json()


def check_state(st, where: str = "state") -> dict:
    """``st`` (either version) as a ``watch-state/2`` state, each field checked; a ValueError
    naming the first bad field otherwise."""
    return WatchState.read(st, where).to_json()


# ------------------------------------------------------------------ watch-state/1

# The first layout, field by field (kinds as in rules.base). Keys not listed are refused, except
# the parameter-norm rule's per-key bases (``param_base/<key>``).
_SIGNAL_V1 = {"level": ("int", 0, 2), "run_sev": ("int?", -1, 2), "run_len": "count"}
_DIRS = ("above", "below")
V1_FIELDS: dict = {
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
    "signals": ("map", _SIGNAL_V1),
    "tails": ("map", "nums"),
}
_BASE_V1 = "param_base/"
# the keys of the health signals (and their trailing values) in the first layout, by the rule
# that keeps them now; any other params/norm/ key is a parameter group's (param_norm)
_KEYED_V1 = {"grad/norm": "grad_norm", "moe/drop_frac": "drop_frac",
             "moe/router_entropy": "router_entropy", "moe/load_max_over_mean": "expert_load",
             "params/norm/router_bias": "router_bias"}


def _check_v1(v, spec, where: str):
    if isinstance(spec, dict):
        if not isinstance(v, dict):
            raise ValueError(f"{where}: expected an object, got {str(v)[:40]!r}")
        for k, x in v.items():
            if k not in spec:
                raise ValueError(f"{where}.{k}: unknown field of a watcher state")
            _check_v1(x, spec[k], f"{where}.{k}")
        return v
    if isinstance(spec, tuple) and spec[0] == "map" and isinstance(spec[1], dict):
        if not isinstance(v, dict):
            raise ValueError(f"{where}: expected an object, got {str(v)[:40]!r}")
        return {k: _check_v1(x, spec[1], f"{where}.{k}") for k, x in v.items()}
    return read_field(v, spec, where)


def _v2_of_v1(d: dict, where: str) -> dict:
    """A ``watch-state/1`` state (checked field by field as that version wrote it) in the
    ``watch-state/2`` layout: the same hysteresis, counts and trailing values, so the rules go
    on where they stopped."""
    v1 = {}
    for k, v in d.items():
        spec = V1_FIELDS.get(k)
        if spec is None and isinstance(k, str) and k.startswith(_BASE_V1):
            spec = "num?"
        if spec is None:
            raise ValueError(f"{where}.{k}: unknown field of a watcher state")
        v1[k] = _check_v1(v, spec, f"{where}.{k}")
    out = {k: v1[k] for k in ("last_step", "last_point_time", "n_points", "n_evals", "worst",
                              "not_applicable") if k in v1}
    band = v1.get("band") or {}
    rank = {"warn": 1, "critical": 2}
    if band:
        out["band"] = {"ema": band.get("ema"), "far_len": band.get("far_len", 0),
                       "run": band.get("run_dir"),
                       "run_len": band.get("run_len", 0) if band.get("run_dir")
                       else band.get("in_len", 0),
                       "level": rank.get(band.get("level"), 0),
                       "about": band.get("direction") if band.get("level") else None}
        out["contingency"] = {"sent": band.get("contingency_sent", False)}
    tr = v1.get("trend") or {}
    if tr:
        active = tr.get("dir") is not None
        # raised: a run of evals back near the level it left (in_len), else of evals away from
        # it; not raised: a run of evals beyond the threshold (run_len), else of fine ones
        near = tr.get("in_len", 0) if active else 0
        away = 0 if near else tr.get("run_len", 0)
        out["trend"] = {"hist": tr.get("hist", []), "base": tr.get("base"), "dir": tr.get("dir"),
                        "level": 1 if active else 0, "run": 1 if away else None,
                        "run_len": away or near}
    rise = v1.get("rise") or {}
    if rise:
        up = rise.get("run_len", 0)
        out["rise"] = {"min": rise.get("min"), "level": 1 if rise.get("active") else 0,
                       "run": 1 if up else None, "run_len": up or rise.get("in_len", 0)}
    signals, tails = v1.get("signals") or {}, v1.get("tails") or {}

    def signal(s):
        sev = s.get("run_sev")
        return {"level": s.get("level", 0), "run": sev if sev and sev > 0 else None,
                "run_len": s.get("run_len", 0)}

    for key, name in _KEYED_V1.items():
        sec = {}
        if key in signals:
            sec["signal"] = signal(signals[key])
        if key in tails:
            sec["tail"] = tails[key]
        if sec:
            out[name] = sec
    if v1.get("grad_min") is not None:
        out.setdefault("grad_norm", {})["min"] = v1["grad_min"]
    groups = {"signals": {k: signal(s) for k, s in signals.items() if _group(k)},
              "tails": {k: t for k, t in tails.items() if _group(k)},
              "base": {k[len(_BASE_V1):]: v for k, v in v1.items() if k.startswith(_BASE_V1)}}
    out["param_norm"] = groups
    out["spike"] = {"tail": tails.get("train/loss", []),
                    "last_step": v1.get("last_spike_step")}
    out["nan"] = {"reported": v1.get("nan_reported", [])}
    out["input"] = {"metric_seen": v1.get("metric_seen", False),
                    "missing_metric": v1.get("missing_metric", False)}
    out["stalled"] = {"active": v1.get("stalled", False)}
    return out


def _group(key: str) -> bool:
    return key.startswith("params/norm/") and key not in _KEYED_V1
