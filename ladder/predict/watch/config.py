"""The decision rule's thresholds, derived from the rules (``predict.watch.rules.RULES``): each
rule's ``Config`` is its slice; :class:`WatchConfig` all of them in one frozen object with flat
fields, as a pre-registration's ``decision_rule.parameters`` stores them. A field shared by
several rules is declared once, in a dataclass their slices inherit (``rules.loss.Persistence``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ladder.predict.watch.rules import RULES
from ladder.predict.watch.rules.base import check_thresholds

# decision-rule parameters of earlier versions, ignored when reading an older pre-registration
# (router entropy and drops against the ladder's median; replaced by the envelope)
RETIRED_PARAMETERS = frozenset({"entropy_drop", "drop_warn_ratio", "drop_crit_ratio"})

# The parameters' order in a written pre-registration (its dict's order): the same rule keeps
# the same bytes. A field not listed (a new rule's) follows, in registry order.
WRITTEN_ORDER = (
    # loss
    "alert_level", "ema_alpha", "k_consecutive", "k_critical", "far_factor", "k_far", "k_clear",
    "min_fraction", "trend_rel", "trend_window", "trend_gap", "trend_after", "trend_band",
    "trend_noise_k", "rise_rel", "rise_noise_k", "rise_k", "rise_after", "contingency_fraction",
    # health
    "drop_window", "drop_crit_factor", "drop_warn_abs", "drop_crit_abs", "drop_floor",
    "spike_window", "spike_k", "spike_k_margin", "spike_rel", "grad_window", "grad_after",
    "grad_growth_warn", "grad_ref_warn", "grad_ref_crit", "envelope_margin", "envelope_tol",
    "envelope_tol_max", "param_growth_ratio", "router_bias_after", "router_bias_jump",
    "k_health", "k_health_clear", "nan_keys",
    # run
    "align", "stalled_seconds", "steps_tolerance",
)


def _fields(slices: list[type]) -> list[dataclasses.Field]:
    """The fields of ``slices``, each once, in :data:`WRITTEN_ORDER`; one declared twice with
    another default or check is an error of the rules, raised at import."""
    seen: dict[str, dataclasses.Field] = {}
    for s in slices:
        for f in dataclasses.fields(s):
            old = seen.get(f.name)
            if old is None:
                seen[f.name] = f
            elif (old.default, old.metadata.get("check")) != (f.default, f.metadata.get("check")):
                raise TypeError(f"{f.name}: declared by two rules' thresholds with another "
                                f"default or check ({s.__qualname__})")
    rank = {n: i for i, n in enumerate(WRITTEN_ORDER)}
    came = {n: i for i, n in enumerate(seen)}
    return [seen[n] for n in sorted(seen, key=lambda n: (rank.get(n, len(rank)), came[n]))]


_SLICES = list(dict.fromkeys(r.Config for r in RULES))  # each once, in registry order


class _Flat:
    """What :class:`WatchConfig` adds to its fields."""

    def __post_init__(self):
        check_thresholds(self)           # every field's own check, in field order
        for s in _SLICES:                # then the relations each slice checks
            s.cross_check(self)
        object.__setattr__(self, "_parts", {})

    def slice_of(self, cls: type):
        """The slice ``cls`` (a rule's ``Config``) of these thresholds, built once."""
        parts = self._parts
        got = parts.get(cls)
        if got is None:
            got = parts[cls] = cls(**{f.name: getattr(self, f.name)
                                      for f in dataclasses.fields(cls)})
        return got

    def to_dict(self) -> dict:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping):
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k not in RETIRED_PARAMETERS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown decision-rule parameter")
        return cls(**d)


WatchConfig = dataclasses.make_dataclass(
    "WatchConfig", [(f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
                    for f in _fields(_SLICES)],
    bases=(_Flat,), frozen=True,
    namespace={"__module__": __name__, "__doc__": "Thresholds of the decision rule: every "
               "rule's fields, flat (as stored in the pre-registration); each rule's slice "
               "validates its own."})
