"""Which fitted parameters the data do not pin down: one check for every law.

``identifiability`` gives ``{"flags": {name: [reasons]}, "unidentified": [names]}`` (law.json
``diagnostics.identifiability``; fit.result.LawResult.identifiability). A parameter is flagged
for where its estimate sits (at an end of its range), for where its interval reaches (an end of
its range: a flat direction the replicates run along), and for reasons its law adds (the
Chinchilla family: a fit through its points, the solver's box, an implausible asymptote:
ladder.fit.estimate). A parameter's range and what "reaches it" means are its kind's: a
Chinchilla-family parameter's plausible display-space range (ladder.fit.forms.Param), a curve-law
parameter's bounds on the solver's ``u`` (ladder.fit.curve_forms.CurveParam); both answer
``interval_flags(interval, level)``. A flagged parameter with a prior is flagged, with the
prior said, and not counted as unidentified (the prior pins it down).
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
