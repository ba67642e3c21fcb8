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
                   lo=band.lo, hi=band.hi, final=_f(final.get("loss")),
                   final_lo=_f(final.get("lo")), final_hi=_f(final.get("hi")),
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
        e = np.interp(frac, self.fraction, self.loss, left=np.nan, right=np.nan)
        lo = np.interp(frac, self.fraction, self.lo, left=np.nan, right=np.nan)
        hi = np.interp(frac, self.fraction, self.hi, left=np.nan, right=np.nan)
        if alert and self.config.alert_level != self.level:
            from ladder.predict.band import z_of
            k = z_of(self.config.alert_level) / z_of(self.level)
            lo, hi = e - (e - lo) * k, e + (hi - e) * k
        return e, lo, hi

    def reference(self, key: str, frac: np.ndarray) -> np.ndarray | None:
        """The ladder's median of ``key`` at fraction ``frac`` (NaN outside its range)."""
        sig = (self.health.get("signals") or {}).get(key)
        fr = self.health.get("fractions")
        if not sig or not fr:
            return None
        x = np.array([_f(v) for v in fr])
        y = np.array([_f(v) for v in sig.get("median", [])])
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() < 2:
            return None
        return np.interp(frac, x[ok], y[ok], left=np.nan, right=np.nan)

    def envelope(self, key: str, frac: np.ndarray) -> Envelope | None:
        """The ladder's min and max of ``key`` across rungs at ``frac`` and their tolerance (log
        units, within the configured floor and cap); None without a reference for ``key``."""
        sig = (self.health.get("signals") or {}).get(key)
        lo = self._curve(sig, "min", frac)
        hi = self._curve(sig, "max", frac)
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

    def _curve(self, sig, name, frac):
        fr = self.health.get("fractions")
        if not sig or not fr or not sig.get(name):
            return None
        x = np.array([_f(v) for v in fr])
        y = np.array([_f(v) for v in sig.get(name, [])])
        if x.size != y.size:
            return None
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() < 2:
            return None
        # the bins' outer halves take the edge values (else the last 0.5% goes unjudged)
        out = np.interp(frac, x[ok], y[ok])
        return np.where((frac >= -1e-9) & (frac <= 1 + 1e-9), out, np.nan)

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


def _f(v) -> float:
    x = as_float(v)
    return math.nan if x is None else x


def _first_eval(target: Mapping) -> int:
    """The smallest positive registered eval step of ``target`` (0: none registered)."""
    steps = [_f(s) for s in target.get("eval_steps") or []] \
        if isinstance(target.get("eval_steps"), list) else []
    steps = [int(s) for s in steps if math.isfinite(s) and s > 0]
    return min(steps) if steps else 0
