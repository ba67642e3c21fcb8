"""The watcher state, derived from the rules: the judge's own fields and one section per rule
that keeps a state (its ``State`` under its ``key``). ``check`` takes and returns it as JSON
(``watch-state/2``, :data:`SCHEMA`; ``watch-state/1``, which no release wrote, is refused by
name); a bad field is a ValueError naming it (``state.band.run_len: expected ...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ladder.predict.watch.alerts import SEVERITIES
from ladder.predict.watch.rules import RULES
from ladder.predict.watch.rules.base import RuleState, kept

SCHEMA = "watch-state/2"


_SECTIONS = {r.key: r.State for r in RULES if r.State is not None}


def _sections() -> dict:
    return {k: State() for k, State in _SECTIONS.items()}


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
        return {"schema": SCHEMA,
                **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "sections"},
                **{k: s.to_json() for k, s in self.sections.items()}}

    @classmethod
    def read(cls, d, where: str = "state") -> WatchState:
        """A ``watch-state/2`` state, its schema checked first; missing fields and sections take
        their defaults."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        if d.get("schema") != SCHEMA:
            raise ValueError(f"{where}.schema: expected {SCHEMA!r}, got "
                             f"{str(d.get('schema'))[:40]!r}")
        own = {k: v for k, v in d.items() if k != "schema" and k not in _SECTIONS}
        if "sections" in own:
            raise ValueError(f"{where}.sections: unknown field of a watcher state")
        st = cls.from_json(own, where)
        for k, v in d.items():
            if k in _SECTIONS:
                st.sections[k] = _SECTIONS[k].from_json(v, f"{where}.{k}")
        return st


def new_state() -> dict:
    """A fresh state, as ``check`` takes and returns it."""
    return WatchState().to_json()


def check_state(st, where: str = "state") -> dict:
    """``st`` as a ``watch-state/2`` state, each field checked; a ValueError naming the first bad
    field otherwise."""
    return WatchState.read(st, where).to_json()
