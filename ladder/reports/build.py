"""The report of a ladder's artifacts: :func:`build_report` (`ladder report`, `ladder demo`)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures are rendered to PNG only

from ladder.io import atomic_write_bytes, atomic_write_text, check_writable, staged_dir
from ladder.reports import plots
from ladder.reports.inputs import load_inputs
from ladder.reports.metrics import plot_metrics
from ladder.reports.page import render_html, render_summary

FIGURES = (("ladder", plots.plot_ladder, "no ladder runs with the metric"),
           ("law", plots.plot_law, "no law, no finished rungs and no forecast"),
           ("watch", plots.plot_watch, "no target run and no pre-registration"),
           ("health", plots.plot_health, "no health metrics in any run"),
           # small multiples of a multi-metric pre-registration only (its own section)
           ("metrics", plot_metrics, "a single-metric pre-registration"))


def build_report(out_dir: str | os.PathLike, runs=None, law=None, prereg=None, alerts=None,
                 target_run=None, points=None) -> Path:
    """Write ``index.html``, one PNG per figure and ``summary.md`` into ``out_dir``; return the
    path of ``index.html``. Every input is optional (a path; ``law`` may also be a loaded law
    object); what is missing is said in the report. Bad files raise ``InputError``."""
    out = check_writable(out_dir, field="--out", directory=True)  # a file there: refused
    inp = load_inputs(runs=runs, law=law, prereg=prereg, alerts=alerts, target_run=target_run,
                      points=points)
    pngs: dict[str, bytes] = {}
    missing: dict[str, str] = {}
    # the names a report writes: an old one's are replaced or removed (a stale figure must not
    # pass for the new report); nothing else in --out is ever touched (ladder.io.staged_dir)
    own = tuple(f"{key}.png" for key, _, _ in FIGURES) + ("summary.md", "index.html")
    with staged_dir(out, own=own) as tmp:  # a killed report never mixes two reports
        for key, func, why in FIGURES:
            fig = func(inp)
            if fig is None:
                missing[key] = why
                continue
            pngs[key] = plots.png_bytes(fig)
            atomic_write_bytes(tmp / f"{key}.png", pngs[key])
        atomic_write_text(tmp / "summary.md", render_summary(inp, pngs))
        atomic_write_text(tmp / "index.html", render_html(inp, pngs, missing))
    return out / "index.html"
