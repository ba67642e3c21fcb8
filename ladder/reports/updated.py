"""The updated forecast on the report and the live page (issue 40 item 1): always labelled
"updated", beside the frozen numbers it never replaces. The report computes it from the
artifacts with the watcher's own method (``ladder.predict.updated.update``); the live page reads
the watcher's (``ladder.predict.watch.rules.heading.updated_forecast``).
"""

from __future__ import annotations

import math

import numpy as np

from ladder.io import as_float

def of_inputs(inp) -> dict | None:
    """The updated forecast of a report's target (as JSON: ``label`` "updated", ``final``,
    ``frozen_final``, ``curve``), or None without a target, its evals or a registered final."""
    from ladder.predict.updated import update

    fc, t, pre = inp.forecast, inp.target, inp.prereg
    if fc is None or t is None or not pre or not isinstance(pre.get("final"), dict):
        return None
    fin = [as_float(pre["final"].get(k)) for k in ("loss", "lo", "hi")]
    if any(v is None or not math.isfinite(v) for v in fin) or not fin[1] < fin[0] < fin[2]:
        return None
    s = t.series(inp.metric)
    if not len(s):
        return None
    ok = np.isfinite(fc.loss) & np.isfinite(fc.lo) & np.isfinite(fc.hi) & (fc.fraction > 0)
    if ok.sum() < 2:
        return None
    u = update(fc.fraction[ok], fc.loss[ok], fc.lo[ok], fc.hi[ok], *fin, inp.level,
               np.asarray(s.fraction, float), np.asarray(s.value, float))
    if not u.n_evals:
        return None
    out = u.to_json()
    out["frozen_final"] = {"loss": fin[0], "lo": fin[1], "hi": fin[2]}
    return out


def line(up: dict | None, metric: str) -> str | None:
    """One sentence: the updated final beside the frozen one."""
    if not up:
        return None
    f, z = up["final"], up["frozen_final"]
    return (f"Updated forecast (from the run's {up['n_evals']} evals to "
            f"{up['at_fraction']:.0%} of the run; the pre-registration is unchanged): final "
            f"{metric} {f['loss']:.4f} [{f['lo']:.4f}, {f['hi']:.4f}] ({up['level']:.0%}); "
            f"frozen {z['loss']:.4f} [{z['lo']:.4f}, {z['hi']:.4f}].")


def curve(up: dict | None):
    """The updated curve ahead and its band (``figdata.Curve``, x in fractions of the run), or
    None without one."""
    from ladder.reports.figdata import Curve
    if not up or not up.get("curve"):
        return None
    c = up["curve"]
    return Curve(*(np.array([r[k] for r in c], float) for k in ("fraction", "loss", "lo", "hi")))


def of_watcher(w) -> dict | None:
    from ladder.predict.watch.rules.heading import updated_forecast

    try:
        return updated_forecast(w.view, (w.state or {}).get("heading"))
    except ValueError:  # a damaged section: the page shows the frozen numbers only
        return None
