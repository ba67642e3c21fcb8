"""The report's tables as plain rows (lists of dicts): law parameters with intervals, forecast vs
actual at fixed fractions of the target run, alerts, runs. Rendered to HTML and Markdown by
``ladder.reports.page``; pure functions of the loaded artifacts."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ladder.io import as_float
from ladder.reports.inputs import ReportInputs, not_applicable_spans
from ladder.reports.style import loss_fmt, num, pct, sci, si

CHECKPOINTS = (0.25, 0.5, 0.75, 1.0)
# an eval is "at" a checkpoint within this fraction of the run: evals come every 5% of the run
# (DESIGN.md, trainer), so the nearest is at most 2.5% away
NEAR = 0.03


def param_intervals(law_meta: dict) -> dict[str, tuple[float, float]]:
    """Per-parameter intervals of ``law.json``'s ``uncertainty.intervals`` (name -> [lo, hi],
    as every law ``ladder fit`` writes has them) as name -> (lo, hi)."""
    u = law_meta.get("uncertainty") if isinstance(law_meta, dict) else None
    block = u.get("intervals") if isinstance(u, dict) else None
    out = {}
    for name, v in (block if isinstance(block, dict) else {}).items():
        pair = tuple(as_float(x) for x in v) if isinstance(v, (list, tuple)) else ()
        if len(pair) == 2 and None not in pair:
            out[name] = pair
    return out


def law_rows(inp: ReportInputs) -> list[dict]:
    if inp.law is None:
        return []
    iv = param_intervals(inp.law.meta)
    fixed = inp.law.meta.get("fixed") if isinstance(inp.law.meta.get("fixed"), dict) else {}
    # the law's own table where it was rebuilt (fixed, tied, at a bound, identified or not:
    # ladder.fit.report.parameter_rows, what a notebook shows)
    own = {}
    if inp.law.obj is not None and hasattr(inp.law.obj, "identifiability"):
        from ladder.fit.report import parameter_rows
        try:
            own = {r["name"]: r for r in parameter_rows(inp.law.obj)}
        except (AttributeError, KeyError, TypeError, ValueError):
            own = {}
    rows = []
    for name, value in inp.law.params.items():
        v = as_float(value)
        lo, hi = iv.get(name, (None, None))
        note = "fixed" if name in fixed else ("" if name in iv else "no interval in law.json")
        mine = own.get(name)
        if mine is not None:
            note = "; ".join(x for x in (mine["note"] or note, "" if mine["identified"]
                                         else "NOT IDENTIFIED") if x)
        rows.append({"parameter": name, "value": num(v, 5), "lo": num(lo, 5), "hi": num(hi, 5),
                     "note": note})
    return rows


def forecast_rows(inp: ReportInputs) -> list[dict]:
    fc = inp.forecast
    if fc is None:
        return []
    s = inp.target.series(inp.metric) if inp.target is not None else None
    ok = np.isfinite(s.fraction) if s is not None else []
    gs, vs = (s.fraction[ok], s.value[ok]) if s is not None else (np.array([]), [])
    void = not_applicable_spans(inp)
    rows = []
    for g in CHECKPOINTS:
        f, lo, hi = (float(x) for x in fc.at(g))
        row = {"fraction": f"{g:.0%}", "forecast": loss_fmt(f),
               "band": f"[{loss_fmt(lo)}, {loss_fmt(hi)}]",
               "actual": "not reached", "at": "", "error": "", "inside": ""}
        rows.append(row)
        i = int(np.argmin(np.abs(gs - g))) if len(gs) else None
        if i is None or abs(gs[i] - g) > NEAR:
            continue
        ga, va = float(gs[i]), float(vs[i])
        fa, loa, hia = (float(x) for x in fc.at(ga))  # compare at the eval's fraction
        row.update(actual=loss_fmt(va), at=f"{ga:.1%}", error=pct(va / fa - 1))
        if any(g0 <= ga <= g1 for g0, g1 in void):
            row["inside"] = "not judged (forecast void)"
        elif math.isfinite(loa) and math.isfinite(hia):
            row["inside"] = "yes" if loa <= va <= hia else ("above" if va > hia else "below")
        else:
            row["inside"] = "band missing"
    return rows


# the note a watcher started before its run writes (ladder.sources: "PATH: not there
# (yet); waiting"): once the run has logged, it was start-up, not something to act on
WAITING = "not there (yet)"


def shown_alerts(inp: ReportInputs) -> list[dict]:
    """The alerts, less the start-up "not there (yet)" notes of a target run that then logged."""
    alerts = list(inp.alerts or [])
    if inp.target is not None and inp.target.rows:
        alerts = [a for a in alerts if not (a.get("kind") == "input"
                                            and WAITING in str(a.get("message", "")))]
    return alerts


def alert_rows(inp: ReportInputs, limit: int = 200) -> list[dict]:
    rows = []
    def when(a):  # in the order they fired along the run (the file groups them by signal)
        s = as_float(a.get("step"))
        return (s is None, s or 0.0)
    for a in sorted(shown_alerts(inp), key=when)[:limit]:
        g = as_float(a.get("fraction"))
        step = as_float(a.get("step"))
        rows.append({
            "severity": str(a.get("severity", "")), "kind": str(a.get("kind", "")),
            # an alert about the input has no step: a dash, never "None"
            "step": "-" if step is None else f"{step:g}",
            "fraction": "" if g is None else f"{g:.1%}",
            "value": _opt(a.get("value")), "expected": _opt(a.get("expected")),
            "band": (f"[{loss_fmt(as_float(a.get('lo')))}, {loss_fmt(as_float(a.get('hi')))}]"
                     if a.get("lo") is not None else ""),
            "message": str(a.get("message", "")),
        })
    return rows


def _opt(v) -> str:
    x = as_float(v)
    return "" if x is None else num(x)


def decision_rule(words: str) -> tuple[str, list[str]]:
    """The pre-registered rule's words (predict.watch.rules.decision_rule_words) as (the loss
    rule's first clause, the verdict's rule, in one sentence; every rule's slice)."""
    import re
    items = [x.strip() for x in re.split(r"(?<=[.)])\s+(?=[A-Z])", words) if x.strip()]
    loss = next((x for x in items if x.startswith("Loss:")), None)
    if loss is None:
        return (items[0] if items else ""), items
    short = loss.removeprefix("Loss:").strip().split("; ")[0].rstrip(".")
    return f"The verdict: {short[:1].lower() + short[1:]}.", items


def alert_counts(inp: ReportInputs) -> dict[str, int]:
    return Counter(str(a.get("severity", "info")) for a in shown_alerts(inp))


def run_rows(inp: ReportInputs) -> list[dict]:
    rows = []
    runs = [(r, "rung") for r in inp.rungs]
    if inp.target is not None:
        runs.append((inp.target, "target"))
    for r, role in runs:
        s = r.series(inp.metric)
        last = f"{loss_fmt(float(s.value[-1]))} at {s.fraction[-1]:.0%}" if len(s) and \
            np.isfinite(s.fraction[-1]) else "n/a"
        rows.append({"run": r.name, "role": role, "status": r.status,
                     "params": si(r.params), "active": si(r.active_params),
                     "tokens": si(r.planned_tokens), "compute": sci(r.compute),
                     f"last {inp.metric}": last})
    return rows
