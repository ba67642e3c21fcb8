"""The one read-only view of a pre-registration's forecast (shared/DESIGN.md section 3): the
watcher (``predict.watch.PreregView``) and the report (``reports.inputs``) both take it from
:func:`forecast_band`, so the curve the report draws is the one the alerts judge against.
Tolerant by design: a partial document shows what is there (authenticity is
:func:`predict.prereg.verify_doc`'s job). ``band_level`` is the level of the registered
``lo``/``hi``; the alerts widen it to ``decision_rule.parameters.alert_level``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ladder.io import as_float

COLUMNS = ("fraction", "step", "tokens", "loss", "lo", "hi")


@dataclass(frozen=True)
class ForecastBand:
    """The registered forecast rows as arrays sorted by fraction (NaN where a row has no value)."""

    fraction: np.ndarray
    step: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def at(self, fraction) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(loss, lo, hi) interpolated in fraction over the rows where each is finite; NaN
        outside the registered grid."""
        g = np.asarray(fraction, float)
        out = []
        for arr in (self.loss, self.lo, self.hi):
            ok = np.isfinite(arr)
            out.append(np.interp(g, self.fraction[ok], arr[ok], left=np.nan, right=np.nan)
                       if ok.any() else np.full(g.shape, np.nan))
        return out[0], out[1], out[2]


def forecast_band(prereg: Mapping) -> ForecastBand | None:
    """``prereg["forecast"]`` as a :class:`ForecastBand` (rows without a finite fraction skipped,
    equal fractions in registered order); None when there is no row."""
    rows = prereg.get("forecast")
    if not isinstance(rows, list):
        return None
    cols: dict[str, list[float]] = {k: [] for k in COLUMNS}
    for r in rows:
        if not isinstance(r, Mapping):
            continue
        g = as_float(r.get("fraction"))
        if g is None or not np.isfinite(g):
            continue
        for k in COLUMNS:
            v = as_float(r.get(k))
            cols[k].append(np.nan if v is None else v)
    if not cols["fraction"]:
        return None
    order = np.argsort(np.asarray(cols["fraction"], float), kind="stable")
    return ForecastBand(*(np.asarray(cols[k], float)[order] for k in COLUMNS))


def band_level(prereg: Mapping) -> float | None:
    """The level of the registered band (``band_level``), None when absent or not in (0, 1)."""
    v = as_float(prereg.get("band_level"))
    return v if v is not None and 0 < v < 1 else None


def target_of(prereg: Mapping) -> dict:
    """The registered ``target`` object ({} when absent)."""
    t = prereg.get("target")
    return dict(t) if isinstance(t, Mapping) else {}
