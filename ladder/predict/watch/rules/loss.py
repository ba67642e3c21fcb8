"""The loss rules, judged eval by eval on one shared :class:`EvalPoint` (the residual's EMA):
band, trend, rising and the contingency advisory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ladder.predict.watch.alerts import SEVERITIES, Alert, float_or_nan
from ladder.predict.watch.rules.base import (Context, Rule, RuleState, Thresholds, alpha, kept,
                                             open_unit, positive, positive_int, threshold, unit)
from ladder.predict.watch.rules.hysteresis import Hysteresis


@dataclass
class EvalPoint:
    """One eval as the loss rules see it: the metric ``y``, the forecast ``e`` and the alert band
    ``lo``..``hi`` at fraction ``f``, the residual ``r = y - e`` and its EMA ``ema`` (the
    smoothed value is ``e + ema``); ``raised``: the direction of a band alert raised at it."""

    step: int
    tokens: float | None
    f: float
    y: float
    e: float
    lo: float
    hi: float
    r: float
    ema: float
    raised: str | None = None


class LossRule(Rule):
    """A loss rule: judged eval by eval on the registered metric, drawn on the loss plot."""

    scope = "eval"
    family = "loss"
    panel = "watch"
    reads_metric = True


@dataclass(frozen=True)
class Smoothing(Thresholds):
    """The residual every loss rule reads: its alert band and its smoothing."""

    # the registered band (say 90%) widened by z(alert_level)/z(band_level): a healthy run sits
    # outside a calibrated 90% band 10% of the time and its offset persists, so alerting at 90%
    # would flag ~1 healthy run in 10 (bench/watch_quality.py measures both)
    alert_level: float = threshold(0.99, open_unit)
    ema_alpha: float = threshold(0.5, alpha)  # the residual's EMA over evals (1.0 = none)
    min_fraction: float = threshold(0.01, unit)  # none before (warmup, steep start)


@dataclass(frozen=True)
class Persistence(Thresholds):
    """How many evals a loss condition must hold before it is raised and be gone to clear."""

    k_consecutive: int = threshold(3, positive_int)  # evals outside before a warning
    k_clear: int = threshold(2, positive_int)        # evals back inside before "cleared"


class BandRule(LossRule):
    name = "band"
    kinds = ("above_band", "below_band", "cleared")
    description = "the smoothed metric outside the forecast band, with hysteresis"
    template = ("Loss: the eval metric's residual against the forecast, smoothed by an EMA (alpha "
                "{c.ema_alpha}), outside the band widened from {level:.0%} to {c.alert_level:.0%} "
                "(half-widths x z({c.alert_level})/z({level}), Gaussian) for {c.k_consecutive} "
                "consecutive evals is a warning (above_band = worse than forecast, below_band = "
                "better); outside for {c.k_critical} evals, or beyond the band by {c.far_factor}x "
                "its half-width for {c.k_far} evals, is critical; inside again for {c.k_clear} "
                "evals clears it. Evals before {c.min_fraction:.0%} of the run are not compared.")

    @dataclass(frozen=True)
    class Config(Smoothing, Persistence):
        k_critical: int = threshold(6, positive_int)  # evals outside before critical
        far_factor: float = threshold(1.0, positive)  # beyond the band by this x its half-width ...
        k_far: int = threshold(2, positive_int)       # ... for this many evals -> critical

        def cross_check(self) -> None:
            if self.k_critical < self.k_consecutive:
                raise ValueError("k_critical: must be >= k_consecutive")

    @dataclass
    class State(Hysteresis):
        """The band's hysteresis, the residual's EMA every loss rule reads (the value the band
        judges) and the run of evals far outside."""

        about: str | None = kept(("enum?", ("above", "below")))
        run: str | None = kept(("enum?", ("above", "below")))
        ema: float | None = kept("num?")
        far_len: int = kept("count", 0)

    def judge(self, ctx: Context, cfg: Config, bs: State, ev: EvalPoint) -> None:
        view = ctx.view
        f, e, lo, hi, y = ev.f, ev.e, ev.lo, ev.hi, ev.y
        ys = e + ev.ema
        direction = "above" if ys > hi else "below" if ys < lo else None
        if direction:
            half, excess = (hi - e, ys - hi) if direction == "above" else (e - lo, lo - ys)
            far = excess > cfg.far_factor * half
            bs.far_len = (bs.far_len if bs.run == direction else 0) + 1 if far else 0
            bs.extend(direction)
            critical = bs.run_len >= cfg.k_critical or (
                bs.far_len >= cfg.k_far and bs.run_len >= min(cfg.k_far, cfg.k_consecutive))
            want = 2 if critical else 1 if bs.run_len >= cfg.k_consecutive else 0
            if bs.settle(want, about=direction, k_clear=cfg.k_clear):
                why = ("far outside the band" if want == 2 and bs.far_len >= cfg.k_far and
                       bs.run_len < cfg.k_critical else f"{bs.run_len} consecutive evals")
                worse = "worse" if direction == "above" else "better"
                ctx.emit(Alert(ctx.stamp, ev.step, ev.tokens, f, f"{direction}_band",
                               SEVERITIES[want], value=ys, expected=e, lo=lo, hi=hi,
                               direction=worse,
                               message=f"{view.metric} {ys:.4f} (smoothed; raw {y:.4f}) is "
                                       f"{worse} than forecast {e:.4f} [{lo:.4f}, {hi:.4f}] at "
                                       f"{cfg.alert_level:.0%}: {why}"))
                ev.raised = direction
        else:
            bs.far_len = 0
            bs.extend(None)
            ch = bs.settle(0, k_clear=cfg.k_clear)
            if ch:
                was = f"{ch.about_before}_band"
                ctx.emit(Alert(ctx.stamp, ev.step, ev.tokens, f, "cleared", "info",
                               value=ys, expected=e, lo=lo, hi=hi, direction=None,
                               message=f"{view.metric} back inside the band for {bs.run_len} "
                                       f"evals (was {was}, {SEVERITIES[ch.level_before]})",
                               extra={"key": view.metric, "clears": was}))


class TrendRule(LossRule):
    name = "trend"
    kinds = ("trend", "cleared")
    description = ("the residual to the forecast moving away from its own earlier level (inside "
                   "the band)")
    template = ("After {c.trend_after:.0%} of the run, the smoothed residual moving from its own "
                "median over the preceding {c.trend_window:.0%} of the run (ending "
                "{c.trend_gap:.0%} before) by more than the largest of {c.trend_rel:.0%} of the "
                "forecast, {c.trend_band}x the band's relative half-width there and "
                "{c.trend_noise_k}x the smoothed residual's own noise, for {c.k_consecutive} "
                "evals, is a 'trend' warning when worse than forecast (info when better), cleared "
                "when it is back within half that of the earlier level for {c.k_clear} evals.")

    @dataclass(frozen=True)
    class Config(Smoothing, Persistence):
        # a change against the run's own earlier level (a step or drift inside the band: a healthy
        # run keeps its offset to the forecast, a fault moves it)
        trend_rel: float = threshold(0.01, positive)  # moved by 1% of the forecast ...
        trend_window: float = threshold(0.5, unit)    # ... from its median over the preceding 50%
        #   of the run (0.3 misses slow drifts: docs/LOG.md 2026-12-01, bench/watch_quality.py) ...
        trend_gap: float = threshold(0.03, unit)      # ... ending 3% of the run before the eval
        trend_after: float = threshold(0.25, unit)    # the early curve is least certain (the cpu
        #   demo's healthy hero drifted 2.2% toward "better" between 10% and 30%)
        trend_band: float = threshold(0.25, unit)     # at least this x the band's relative
        #   half-width there (a wide band: a shape the law knows less well) ...
        trend_noise_k: float = threshold(4.0, positive)  # ... and this x the smoothed residual's
        #   own eval-to-eval noise

    @dataclass
    class State(Hysteresis):
        """The trend's hysteresis, the (fraction, relative residual) history over the window, and
        while raised the level it left (``base``) and the direction (``dir``)."""

        hist: list = kept("pairs", factory=list)
        base: float | None = kept("num?")
        dir: str | None = kept("str?")

    def judge(self, ctx: Context, cfg: Config, ts: State, ev: EvalPoint) -> None:
        view = ctx.view
        f, rel, rel_smooth, step, tokens, e = (ev.f, ev.r / ev.e, ev.ema / ev.e, ev.step,
                                               ev.tokens, ev.e)
        hist = ts.hist
        hist.append([f, rel])
        lo_f = f - cfg.trend_window - cfg.trend_gap
        while hist and hist[0][0] < lo_f - 1e-9:
            hist.pop(0)
        if f < cfg.trend_after:
            return
        if ts.level:  # alert active: clear when back near the level it left
            near = abs(rel_smooth - ts.base) <= self.threshold(view, cfg, hist, f) / 2
            ts.extend(None if near else 1)
            if ts.settle(1, k_raise=cfg.k_consecutive, k_clear=cfg.k_clear):
                ctx.emit(Alert(ctx.stamp, step, tokens, f, "cleared", "info",
                               value=e * (1 + rel_smooth), expected=e, direction=None,
                               message=f"{view.metric} back within half the threshold of its "
                                       f"earlier level relative to the forecast (was trend, "
                                       f"{ts.dir})",
                               extra={"key": view.metric, "clears": "trend"}))
                ts.dir, ts.base = None, None
            return
        base_vals = [v for g, v in hist if lo_f - 1e-9 <= g <= f - cfg.trend_gap + 1e-9]
        if len(base_vals) < 3:
            return
        base = float(np.median(base_vals))
        d = rel_smooth - base
        thr = self.threshold(view, cfg, hist, f)
        out = abs(d) > thr
        ts.extend(1 if out else None)
        if ts.settle(1 if out else 0, k_raise=cfg.k_consecutive, k_clear=cfg.k_clear):
            worse = "worse" if d > 0 else "better"
            ts.dir, ts.base = worse, base
            # better than forecast is no risk to the run: recorded, not raised
            ctx.emit(Alert(ctx.stamp, step, tokens, f, "trend",
                           "warn" if worse == "worse" else "info",
                           value=e * (1 + rel_smooth), expected=e * (1 + base), direction=worse,
                           message=f"{view.metric} moved {d:+.2%} of the forecast away from its "
                                   f"own level over the preceding {cfg.trend_window:.0%} of the "
                                   f"run ({base:+.2%} -> {rel_smooth:+.2%} vs forecast; "
                                   f"threshold {thr:.2%}): {worse}, for {ts.run_len} evals",
                           extra={"threshold": thr}))

    @staticmethod
    def threshold(view, cfg: Config, hist: list, f: float) -> float:
        """The threshold (relative to the forecast) at ``f``: the largest of the floor, a share
        of the band's relative half-width and a multiple of the smoothed residual's noise
        (1.4826 x the median absolute first difference / sqrt(2): a slow drift barely changes
        first differences; x the EMA's sd factor sqrt(alpha / (2 - alpha)))."""
        thr = max(cfg.trend_rel, cfg.trend_band * view.band_half_rel(f))
        if len(hist) >= 8:
            r = np.array([v for _, v in hist])
            sd = 1.4826 * float(np.median(np.abs(np.diff(r)))) / math.sqrt(2)
            a = cfg.ema_alpha
            thr = max(thr, cfg.trend_noise_k * sd * math.sqrt(a / (2 - a)))
        return thr


class RiseRule(LossRule):
    name = "rising"
    kinds = ("rising", "cleared")
    description = "the held-out metric rising above its own running minimum"
    key = "rise"
    template = ("From {c.rise_after:.0%} of the run, the metric above its lowest value so far "
                "by more than {c.rise_rel:.0%} of it (and {c.rise_noise_k}x the ladder's eval "
                "noise) for {c.rise_k} consecutive evals is a 'rising' warning.")

    @dataclass(frozen=True)
    class Config(Persistence):
        # a healthy run's held-out loss does not rise; a data or optimizer fault makes it, well
        # before a wide band shows it (cpu demo, drift from 40%: +4.9% one eval after onset; the
        # band and trend rules needed 5 evals)
        rise_rel: float = threshold(0.01, positive)     # above the running minimum by 1% of it
        rise_noise_k: float = threshold(4.0, positive)  # ... and this x the ladder's eval noise
        rise_k: int = threshold(2, positive_int)        # ... for this many evals in a row: warn
        rise_after: float = threshold(0.1, unit)        # judged from 10% of the run on

    @dataclass
    class State(Hysteresis):
        """The rising rule's hysteresis and the metric's lowest value so far."""

        min: float | None = kept("num?")

    def judge(self, ctx: Context, cfg: Config, rs: State, ev: EvalPoint) -> None:
        view = ctx.view
        f, y, step, tokens = ev.f, ev.y, ev.step, ev.tokens
        low = rs.min
        rs.min = y if low is None else min(low, y)
        if low is None or f < cfg.rise_after:
            return
        thr = max(cfg.rise_rel * low, cfg.rise_noise_k * view.eval_noise)
        up = y - low > thr
        rs.extend(1 if up else None)
        ch = rs.settle(1 if up else 0, k_raise=cfg.rise_k, k_clear=cfg.k_clear)
        if ch and ch.kind == "raised":
            ctx.emit(Alert(ctx.stamp, step, tokens, f, "rising", "warn", value=y, expected=low,
                           direction="worse",
                           message=f"{view.metric} {y:.4f} is {y / low - 1:+.2%} above its "
                                   f"lowest value so far ({low:.4f}; threshold {thr:.4f}) for "
                                   f"{rs.run_len} consecutive evals: a healthy run's held-out "
                                   f"loss does not rise", extra={"threshold": thr}))
        elif ch:
            ctx.emit(Alert(ctx.stamp, step, tokens, f, "cleared", "info", value=y, expected=low,
                           message=f"{view.metric} back within {thr:.4f} of its lowest value "
                                   f"(was rising)", extra={"key": view.metric,
                                                           "clears": "rising"}))


class ContingencyRule(LossRule):
    name = "contingency"
    kinds = ("contingency",)
    description = ("a confirmed deviation early in the run: projected final value and the budget "
                   "to reach the registered one")
    template = ("A confirmed above_band deviation inside the first {c.contingency_fraction:.0%} "
                "of the token budget adds a contingency advisory.")

    @dataclass(frozen=True)
    class Config(Thresholds):
        contingency_fraction: float = threshold(0.25, unit)  # the real plan's first 25% of tokens

    @dataclass
    class State(RuleState):
        """Whether the advisory was sent (once per run)."""

        sent: bool = kept("bool", False)

    def judge(self, ctx: Context, cfg: Config, st: State,
              ev: EvalPoint) -> None:
        if ev.raised == "above" and ev.f <= cfg.contingency_fraction and not st.sent:
            st.sent = True
            ctx.emit(self.advisory(ctx.view, cfg, ev.step, ev.tokens, ev.f, ev.e + ev.ema, ev.e,
                                   ctx.stamp))

    @staticmethod
    def advisory(view, cfg: Config, step: int, tok: float | None, f, ys,
                 e, stamp) -> Alert:
        """Projected final value if the run continues (the same ratio to the forecast to the
        end), and the token budget that would still reach the registered final (the
        pre-registration's ``budget_curve``)."""
        ratio = ys / e
        projected = view.final * ratio
        bc = view.budget
        budget_msg = "no budget curve in the pre-registration"
        needed = None
        mult = np.array([float_or_nan(v) for v in bc.get("multiplier", [])])
        fl = np.array([float_or_nan(v) for v in bc.get("loss", [])])
        if mult.size >= 2 and np.isfinite(fl).all():
            scaled = fl * ratio
            # final loss falls with the budget: the smallest budget whose scaled loss <= registered
            ok = np.flatnonzero(scaled <= view.final)
            if ok.size == 0:
                budget_msg = (f"not reached within {mult.max():g}x the planned tokens "
                              f"({mult.max() * view.tokens:.3g})")
            else:
                k = int(ok[0])
                if k == 0:
                    needed = float(mult[0])
                else:  # linear interpolation between the bracketing budgets
                    x0, x1, y0, y1 = mult[k - 1], mult[k], scaled[k - 1], scaled[k]
                    needed = float(x0 + (view.final - y0) * (x1 - x0) / (y1 - y0))
                budget_msg = (f"the registered final {view.final:.4f} would still be reached at "
                              f"about {needed:.2f}x the planned tokens ({needed * view.tokens:.3g}"
                              f" tokens)")
            # the law's finals for shorter plans
            short = [(m, x * ratio) for m, x in zip(mult, fl)
                     if m < 1 and m in (0.5, 0.6, 0.7, 0.85)]
            if short:
                budget_msg += ("; shortened with the LR decay re-aimed to the new end: " +
                               ", ".join(f"{m:g}x -> {x:.4f}" for m, x in short) +
                               f" (as planned: {projected:.4f})")
        return Alert(stamp, step, tok, f, "contingency", "info", value=projected,
                     expected=view.final, lo=view.final_lo, hi=view.final_hi, direction="worse",
                     message=f"deviation confirmed at {f:.1%} of the token budget (inside the "
                             f"first {cfg.contingency_fraction:.0%}): if the run continues, final "
                             f"{view.metric} ~ {projected:.4f} vs registered {view.final:.4f}; "
                             f"{budget_msg}. Consider shortening and re-aiming the LR decay, then "
                             f"`ladder preregister --amend`.",
                     extra={"projected_final": projected, "budget_multiplier": needed})
