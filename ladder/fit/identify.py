"""Which fitted parameters the data do not pin down, one check for every law: ``{"flags": {name:
[reasons]}, "unidentified": [names]}`` (law.json ``diagnostics.identifiability``). A parameter's
kind says when its interval reaches its range (``interval_flags``: fit.forms.Param's display
range, fit.curve_forms.CurveParam's bounds on ``u``); a law adds its own reasons. A flagged
parameter with a prior says so and is not unidentified (the prior pins it down).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def identifiability(params: Iterable, intervals: Mapping, level: float, *,
                    estimate: Mapping[str, Sequence[str]] | None = None,
                    before: Sequence[str] = (), after: Mapping[str, Sequence[str]] | None = None,
                    prior: Iterable[str] = ()) -> dict:
    """The flags of the free ``params`` (objects with ``name`` and ``interval_flags``):
    per parameter, the reasons ``before`` (every parameter's), its ``estimate`` reasons, its
    interval's (at ``level``, from ``intervals`` {name: [lo, hi]}), and its own ``after``."""
    estimate, after, prior = estimate or {}, after or {}, set(prior)
    flags: dict[str, list[str]] = {}
    for p in params:
        why = [*before, *estimate.get(p.name, ()),
               *p.interval_flags(intervals.get(p.name), level), *after.get(p.name, ())]
        if why and p.name in prior:
            why.append("(a prior is set on it)")
        if why:
            flags[p.name] = why
    return {"flags": flags, "unidentified": sorted(k for k in flags if k not in prior)}
