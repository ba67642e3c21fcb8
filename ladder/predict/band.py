"""The band of a forecast in one module: what it holds, where each term comes from, and how well
it covers. A point's band at ``level`` is a central interval, z = Phi^-1(1/2 + level/2) (1.645 at
90%), of three terms:

1. **The law's band** (:func:`law_band`), which the law computes its own way: a Chinchilla-family
   law (ladder.fit.result.FitResult._band) from its bootstrap parameter draws (the percentile
   bootstrap, Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13), the
   split-conformal quantile of its fitted points' residuals for the run-to-run noise (Lei,
   G'Sell, Rinaldo, Tibshirani & Wasserman 2018, JASA 113:1094) and term 2; an OLS law from
   statsmodels' prediction interval of log(L - E); a curve law from bootstrap draws of the curve.
2. **The law's extrapolation error** (:func:`extrapolation_error`): the target lies beyond every
   rung, and the rollout backtest (fit.backtest: refit on the smaller runs, forecast the larger)
   measured how wrong the law is per decade outside its runs (without it the cpu demo's proxy
   hero fell outside its band, docs/LOG.md). Only the law knows this term (issue 13): it is read
   from the law for the record (prereg.json ``extrapolation``), never added again here.
3. **Eval noise** (:func:`estimate_eval_noise`, :func:`combine_band`): a watched value is one
   eval on a finite eval set, scattered about the run's smooth curve. Its sd comes from the
   ladder's evals by the pseudo-residuals of Gasser, Sroka & Jennen-Steinmetz (1986, Biometrika
   73:625) and 1.4826 x MAD (Rousseeuw & Croux 1993, JASA 88:1273), or is given.

The terms are independent, approximately Gaussian errors: their half-widths add in quadrature
(JCGM 100:2008 "GUM" 5.1.2), on each side of an asymmetric band; an amendment's parts likewise,
in log units (:func:`amended_band`). A band that cannot be computed stays NaN (missing, loudly),
never zero width. Its calibration (leave one rung out) is measured by bench/band_calibration.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
import numpy as np
from scipy.special import ndtri  # the normal quantile; scipy.stats takes 0.6 s to import

from ladder.predict.prereg_view import ForecastBand


def z_of(level: float) -> float:
    """The normal quantile of a central interval at ``level`` (1.6449 at 0.9)."""
    return float(ndtri(0.5 + level / 2))


# ------------------------------------------------------------------------------ 1. the law's band


def law_band(law, inputs: Mapping, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loss, lo, hi) of ``law.predict`` at ``inputs`` (params, active_params, tokens and compute
    so far, fraction: arrays of one shape), broadcast to that shape: the forecaster's one call
    of a law."""
    res = law.predict(params=inputs["params"], active_params=inputs["active_params"],
                      tokens=inputs["tokens"], compute=inputs["compute"],
                      fraction=inputs["fraction"], level=level)
    shape = np.shape(inputs["fraction"])
    return tuple(np.broadcast_to(np.asarray(getattr(res, k), float), shape).copy()
                 for k in ("loss", "lo", "hi"))


# ------------------------------------------------------------------------------ 2. extrapolation


@dataclass(frozen=True)
class Extrapolation:
    """How wrong the law was when the ladder extrapolated it (a log sd at the target), as
    prereg.json records it."""

    sigma_log: float
    n: int
    method: str
    in_law_band: bool = False  # the law's own band holds it (a measured term, always there)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def extrapolation_error(law, target) -> Extrapolation:
    """The law's own extrapolation error at ``target`` (a predict.forecast.Target): from its
    rollout backtest (law.json ``diagnostics.backtest``), the sd its band holds there
    (``law.extrapolation_log_sd``; 0 inside the fitted range). No rate (a curve law, a fit with
    ``backtest=False``, a ladder too short for a fold) or no scale to place the target: 0, and
    the method says so."""
    from ladder.fit.result import extrapolation_rate
    bt = ((law.to_json() or {}).get("diagnostics") or {}).get("backtest") or {}
    rate, kind, _bottom, _top = extrapolation_rate(bt)
    n = sum(1 for f in bt.get("folds") or [] if isinstance(f, dict)
            and isinstance(f.get("decades"), (int, float)) and f["decades"] > 0
            for e in f.get("final_rel_err") or [] if isinstance(e, (int, float))
            and math.isfinite(e) and e > -1)
    scale = None if target is None else {"compute": target.compute,
                                         "params_x_tokens": target.params * target.tokens,
                                         "params": target.params}.get(kind)
    if rate is None or not scale or scale <= 0:
        return Extrapolation(0.0, n, "none (the law carries no rollout backtest on a scale "
                                     "the target has)", False)
    sd = float(law.extrapolation_log_sd(params=target.params, tokens=target.tokens,
                                        compute=target.compute, fraction=1.0,
                                        active_params=target.active_params))
    decades = sd / rate if rate > 0 else 0.0
    pooled = bt.get("extrapolation") if isinstance(bt.get("extrapolation"), dict) else None
    if pooled is not None and isinstance(pooled.get("power"), (int, float)) and \
            isinstance(pooled.get("log_sd_scale"), (int, float)):
        # the power model (ladder.fit.backtest.EXTRAPOLATION_POWER): s d^p outside the runs
        n = int(pooled.get("n_points") or 0)
        points = f"{n} held-out point{'s' if n != 1 else ''}"
        what = (f"rollout backtest of the law: held-out log error {pooled['log_sd_scale']:.4f} "
                f"x d^{pooled['power']:g} (pooled over {points}), d the decades outside the "
                "fitted runs (their inputs or planned compute)")
    elif pooled is not None and pooled.get("rate_per_decade") is not None:
        # the pooled rate (ladder.fit.backtest): every held-out point outside its fold's range, the
        # distance over the form's inputs
        n = int(pooled.get("n_points") or 0)
        inputs = ", ".join(map(str, pooled.get("inputs") or [])) or kind
        points = f"{n} held-out point{'s' if n != 1 else ''}"
        what = (f"rollout backtest of the law: log error {rate:.4f} per decade (pooled over "
                f"{points}) x {decades:.2f} decades outside the fitted range of {inputs}")
    else:
        what = (f"rollout backtest of the law: RMS log error {rate:.4f} per decade (of {kind}) "
                f"x {decades:.2f} decades outside the ladder's runs")
    return Extrapolation(sd, n, what + "; inside the law's band", True)


# ------------------------------------------------------------------------------ 3. eval noise


@dataclass(frozen=True)
class EvalNoise:
    """Standard deviation of one eval's metric about the run's smooth curve."""

    sigma: float
    n: int
    method: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def estimate_eval_noise(curves: Iterable[tuple[np.ndarray, np.ndarray]], *,
                        min_fraction: float = 0.2) -> EvalNoise:
    """Eval noise from the scatter of each eval about the line through its two neighbours: for
    evals at x0 < x1 < x2 of a smooth curve, r = y1 - (w y0 + (1 - w) y2), w = (x2 - x1)/(x2 -
    x0), has variance sigma^2 (1 + w^2 + (1-w)^2) for independent errors of sd sigma (Gasser et
    al. 1986) where the curvature is small (hence only evals after ``min_fraction``)."""
    z = []
    for x, y in curves:
        x, y = np.asarray(x, float), np.asarray(y, float)
        ok = np.isfinite(x) & np.isfinite(y) & (x >= min_fraction)
        x, y = x[ok], y[ok]
        order = np.argsort(x)
        x, y = x[order], y[order]
        if x.size < 3:
            continue
        x0, x1, x2 = x[:-2], x[1:-1], x[2:]
        w = (x2 - x1) / np.maximum(x2 - x0, 1e-300)
        r = y[1:-1] - (w * y[:-2] + (1 - w) * y[2:])
        z.append(r / np.sqrt(1 + w ** 2 + (1 - w) ** 2))
    if not z:
        return EvalNoise(sigma=math.nan, n=0, method="second-difference MAD (no data)")
    zz = np.concatenate(z)
    sigma = float(1.4826 * np.median(np.abs(zz - np.median(zz))))
    return EvalNoise(sigma=sigma, n=int(zz.size), method="second-difference MAD")


def combine_band(loss, lo, hi, *, level: float, eval_noise: float):
    """The law's band [lo, hi] around ``loss`` widened by eval noise (an sd in loss units) in
    quadrature on each side."""
    loss, lo, hi = (np.asarray(a, float) for a in (loss, lo, hi))
    e = 0.0 if eval_noise is None or not math.isfinite(eval_noise) else float(eval_noise)
    extra = (z_of(level) * e) ** 2
    lo2 = loss - np.sqrt((loss - lo) ** 2 + extra)
    hi2 = loss + np.sqrt((hi - loss) ** 2 + extra)
    return lo2, hi2  # NaN stays NaN: missing uncertainty is never made up


def target_band(law, inputs: Mapping, *, level: float, eval_noise: float):
    """The band at the target's points: (loss, the law's lo and hi, the forecast's lo and hi)."""
    loss, lo, hi = law_band(law, inputs, level)
    lo2, hi2 = combine_band(loss, lo, hi, level=level, eval_noise=eval_noise)
    return loss, lo, hi, lo2, hi2


# ------------------------------------------------------------------------------ an amendment


def registered_half_widths(band: ForecastBand, fraction) -> tuple[np.ndarray, np.ndarray]:
    """(up, down): a registered band's half-widths in log units, log(hi / loss) and
    log(loss / lo), interpolated at ``fraction`` of its run (clipped to its grid)."""
    fo = np.clip(np.asarray(fraction), band.fraction[0], band.fraction[-1])
    e = np.interp(fo, band.fraction, band.loss)
    lo = np.interp(fo, band.fraction, band.lo)
    hi = np.interp(fo, band.fraction, band.hi)
    with np.errstate(all="ignore"):
        return np.log(hi / e), np.log(e / lo)


@dataclass(frozen=True)
class AmendedBand:
    """The band of an amended forecast's rows from step S on: half-widths in log units around
    the centre, the law's part and the change's part apart (prereg ``lo_law``/``hi_law``,
    ``lo_change``/``hi_change``), combined in quadrature (``lo``/``hi``)."""

    law_up: np.ndarray
    law_down: np.ndarray
    change_up: np.ndarray
    change_down: np.ndarray
    anchor_sd: float          # the anchor's own noise (log units)

    def bounds(self, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (centre * np.exp(-np.hypot(self.law_down, self.change_down)),
                centre * np.exp(np.hypot(self.law_up, self.change_up)))

    @property
    def final_share_of_change(self) -> float:
        """The change's share of the final band's variance."""
        ch = np.hypot(self.change_up[-1], self.change_down[-1]) ** 2
        return float(ch / max(ch + np.hypot(self.law_up[-1], self.law_down[-1]) ** 2, 1e-300))


def amended_band(old_up, old_down, old_up_s: float, old_down_s: float, *, level: float,
                 eval_noise: float, anchor_values: np.ndarray, evidence: np.ndarray,
                 evidence_lo: np.ndarray, evidence_hi: np.ndarray,
                 multiplier_level: float | None) -> AmendedBand:
    """The band of an amendment at step S (ladder.predict.amend), in two parts:

    - the law's: the old band's log half-width at f (``old_up``/``old_down``) with its part at S
      (``old_up_s``/``old_down_s``) removed, sqrt(max(w(f)^2 - w(S)^2, 0)) (the anchor fixes the
      level at S: what is left is how wrong the law's *change* from S to f may be), plus the
      noise of the anchor (the mean of ``anchor_values``) and of one eval, relative to the
      anchor's level;
    - the change's: the ``evidence`` at the multiplier's interval ends (``evidence_lo``: the
      larger multiplier) against its centre, mapped from the multiplier's level to ``level``;
      its wider side on both sides (issue 40: a lopsided interval, 1.20x [1.19, 1.50], put a
      real run's amended centre at its own upper edge, 2.0842 [1.9204, 2.0921], and the healthy
      run above it: how far the multiplier may be off says how far the centre may be, not on
      which side; tests/test_amend_property.py)."""
    z = z_of(level)
    noise_log = eval_noise / float(np.exp(np.mean(np.log(anchor_values)))) if eval_noise else 0.0
    anchor_sd = noise_log / math.sqrt(anchor_values.size)
    extra = (z * anchor_sd) ** 2 + (z * noise_log) ** 2
    law_up = np.sqrt(np.maximum(old_up ** 2 - old_up_s ** 2, 0.0) + extra)
    law_down = np.sqrt(np.maximum(old_down ** 2 - old_down_s ** 2, 0.0) + extra)
    scale = 1.0 if multiplier_level in (None, level) else z / z_of(multiplier_level)
    with np.errstate(divide="ignore", invalid="ignore"):
        ch = np.fmax(np.log(evidence / evidence_lo), np.log(evidence_hi / evidence))
    ch = np.maximum(ch, 0.0) * scale
    return AmendedBand(law_up, law_down, ch, ch.copy(), anchor_sd)
