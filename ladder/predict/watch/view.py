"""What the watcher needs from a pre-registration, as arrays (:class:`PreregView`): the forecast
and its band, the ladder's health reference and envelopes, the budget curve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ladder.io import InputError, as_float, sha256_of
from ladder.predict.prereg_view import forecast_band
from ladder.predict.watch.alerts import float_or_nan
from ladder.predict.watch.config import WatchConfig


@dataclass(frozen=True)
class PreregView:
    """What the watcher needs from a pre-registration dict, as arrays."""

    metric: str
    steps: int
    tokens: float
    fraction: np.ndarray
    loss: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    final: float
    final_lo: float
    final_hi: float
    level: float
    config: WatchConfig
    applicability: dict
    health: dict
    budget: dict
    sha256: str
    eval_noise: float = 0.0
    # the target's first planned eval step (its eval_steps; 0 when not registered): before it,
    # rows without the metric are what a healthy run logs
    first_eval_step: int = 0

    @classmethod
    def of(cls, prereg: Mapping) -> PreregView:
        band = forecast_band(prereg)  # the registered curve as the report draws it
        if band is None:
            raise InputError("no forecast rows", field="forecast")
        rule = prereg.get("decision_rule", {})
        params = rule.get("parameters", {}) if isinstance(rule, dict) else {}
        target = prereg["target"]
        final = prereg.get("final", {})
        return cls(metric=prereg["metric"], steps=int(target["steps"]),
                   tokens=float(target["tokens"]), fraction=band.fraction, loss=band.loss,
                   lo=band.lo, hi=band.hi, final=float_or_nan(final.get("loss")),
                   final_lo=float_or_nan(final.get("lo")), final_hi=float_or_nan(final.get("hi")),
                   level=float(prereg.get("band_level", 0.9)),
                   config=WatchConfig.from_dict(params),
                   applicability=dict(prereg.get("applicability", {})),
                   health=dict(prereg.get("health_reference") or {}),
                   budget=dict(prereg.get("budget_curve") or {}),
                   sha256=str(prereg.get("sha256", sha256_of(prereg))),
                   eval_noise=_noise_sigma(prereg.get("eval_noise")),
                   first_eval_step=_first_eval(target))

    def expected(self, frac: np.ndarray, *, alert: bool = True):
        """Forecast and band at ``frac``; with ``alert``, the band widened to the alert level."""
        f0, f1 = self.fraction[0], self.fraction[-1]
        frac = np.where((frac < f0) & (frac > f0 - 1e-6), f0, frac)  # rounding at the ends
        frac = np.where((frac > f1) & (frac < f1 + 1e-6), f1, frac)
        e, lo, hi = (np.interp(frac, self.fraction, y, left=np.nan, right=np.nan)
                     for y in (self.loss, self.lo, self.hi))
        if alert and self.config.alert_level != self.level:
            from ladder.predict.band import z_of
            k = z_of(self.config.alert_level) / z_of(self.level)
            lo, hi = e - (e - lo) * k, e + (hi - e) * k
        return e, lo, hi

    def reference(self, key: str, frac: np.ndarray) -> np.ndarray | None:
        """The ladder's median of ``key`` at fraction ``frac`` (NaN outside its range)."""
        xy = self._points((self.health.get("signals") or {}).get(key), "median")
        return None if xy is None else np.interp(frac, *xy, left=np.nan, right=np.nan)

    def envelope(self, key: str, frac: np.ndarray) -> Envelope | None:
        """The ladder's min and max of ``key`` across rungs at ``frac`` and their tolerance (log
        units, within the configured floor and cap); None without a reference for ``key``."""
        sig = (self.health.get("signals") or {}).get(key)
        lo, hi = self._curve(sig, "min", frac), self._curve(sig, "max", frac)
        if lo is None or hi is None:  # a reference with medians only: a zero-width envelope
            lo = hi = self._curve(sig, "median", frac)
        if lo is None:
            return None
        tol = sig.get("tolerance") or {}
        fallback = self.config.envelope_tol

        def t(side):
            v = as_float(tol.get(side))
            if v is None or not math.isfinite(v):
                return fallback
            return min(max(v, fallback), max(fallback, self.config.envelope_tol_max))
        return Envelope(lo=lo, hi=hi, tol_below=t("below"), tol_above=t("above"),
                        calibrated=tol.get("below") is not None)

    def _points(self, sig, name):
        """The finite (fraction, value) points of the reference's curve ``name`` of ``sig``;
        None when it has fewer than 2 (or as many values as fractions)."""
        fr = self.health.get("fractions")
        if not sig or not fr or not sig.get(name) or len(fr) != len(sig[name]):
            return None
        x, y = (np.array([float_or_nan(v) for v in vs]) for vs in (fr, sig[name]))
        ok = np.isfinite(x) & np.isfinite(y)
        return (x[ok], y[ok]) if ok.sum() >= 2 else None

    def _curve(self, sig, name, frac):
        xy = self._points(sig, name)
        if xy is None:
            return None
        # the bins' outer halves take the edge values (else the last 0.5% goes unjudged)
        return np.where((frac >= -1e-9) & (frac <= 1 + 1e-9), np.interp(frac, *xy), np.nan)

    def band_half_rel(self, frac: float) -> float:
        """The registered band's relative half-width (hi - lo) / 2 / forecast at ``frac``."""
        e, lo, hi = self.expected(np.array([frac]), alert=False)
        w = float((hi[0] - lo[0]) / 2 / e[0])
        return w if math.isfinite(w) else 0.0


@dataclass(frozen=True)
class Envelope:
    lo: np.ndarray
    hi: np.ndarray
    tol_below: float
    tol_above: float
    calibrated: bool


def _noise_sigma(noise) -> float:
    sigma = as_float(noise.get("sigma")) if isinstance(noise, Mapping) else None
    return sigma if sigma is not None and math.isfinite(sigma) and sigma > 0 else 0.0


def _first_eval(target: Mapping) -> int:
    """The smallest positive registered eval step of ``target`` (0: none registered)."""
    steps = [float_or_nan(s) for s in target.get("eval_steps") or []] \
        if isinstance(target.get("eval_steps"), list) else []
    steps = [int(s) for s in steps if math.isfinite(s) and s > 0]
    return min(steps) if steps else 0
