"""Pictures and pages of the artifacts: `ladder report` and :func:`build_report`.

Plots are pure functions of the JSON/JSONL artifacts (run directories, law.json, prereg.json,
alerts.jsonl); nothing is refitted and JAX is never imported. Evaluating the exported law
(``fit.load_law(...).predict``) is the one computation allowed, since it is part of the artifact.
"""


def build_report(*args, **kwargs):
    """:func:`ladder.reports.build.build_report`, imported lazily (matplotlib loads on use)."""
    from ladder.reports.build import build_report as _build
    return _build(*args, **kwargs)
