"""The early warning (issue 40 item 2): the updated forecast (ladder.predict.updated), conditioned
on the run's evals so far, and its band no longer overlap the frozen band ahead of the run: the
run is heading outside its contract.

``heading_ahead`` compares the updated final with the frozen final band ("final", the default),
or the updated curve ahead (every frozen grid point after the last eval, and the final) with the
frozen band there ("curve", opt-in: it warns earlier, as the end-anchored final band stays wide
for much of the run, but not silent on every healthy public curve: 1 or 2 false warnings of 127
against 0 for "final"; bench/live_forecast.py, docs/live_forecast.md). A closing gap
(``heading_closing`` "hold") neither raises nor clears.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ladder.predict.band import z_of
from ladder.predict.updated import (FilterState, UpdateConfig, curve_ahead, final_band, offset_var,
                                    prior_sd, usable)
from ladder.predict.watch.alerts import Alert
from ladder.predict.watch.rules.base import Context, kept, one_of, positive_int, threshold
from ladder.predict.watch.rules.hysteresis import Hysteresis
from ladder.predict.watch.rules.loss import EvalPoint, LossRule, Persistence, Smoothing


def _tau(view) -> float:
    return prior_sd(view.final, view.final_lo, view.final_hi, view.level)


def updated_final(view, fs: FilterState, cfg: UpdateConfig) -> tuple[float, float, float]:
    """The updated final loss and its band at the registered level, from the filter's state."""
    tau = _tau(view)
    m, half = final_band(fs.level(tau), tau, view.level, cfg)
    return (view.final * math.exp(m), view.final * math.exp(m - half),
            view.final * math.exp(m + half))


def gap_ahead(view, fs: FilterState, cfg: UpdateConfig, hc: HeadingRule.Config
              ) -> tuple[str | None, float]:
    """How far the updated forecast and its band lie outside the frozen band, in log: at the
    final (``heading_ahead`` "final") or at every point of the frozen grid after the last eval
    used, the final included ("curve"); the frozen band at the alert level when
    ``heading_against`` is "alert". The direction ("above", "below") and gap of the point
    farthest apart (a gap <= 0: they overlap everywhere; direction None)."""
    tau = _tau(view)
    lv = fs.level(tau)
    if hc.heading_ahead == "curve":  # the final is the grid's last point
        ahead, m, v = curve_ahead(lv, tau, view.fraction, view.lo, view.hi, view.level, cfg)
        _, f_lo, f_hi = view.expected(view.fraction[ahead], alert=hc.heading_against == "alert")
        base = view.loss[ahead]
    else:
        m, v = lv.predict(np.array([tau * tau]))
        f_lo, f_hi = view.final_lo, view.final_hi
        if hc.heading_against == "alert":  # widened as the band rule widens the curve's
            k = z_of(view.config.alert_level) / z_of(view.level)
            f_lo, f_hi = view.final - (view.final - f_lo) * k, view.final + (f_hi - view.final) * k
        f_lo, f_hi, base = np.array([f_lo]), np.array([f_hi]), np.array([view.final])
    half = z_of(view.level) * cfg.inflation * np.sqrt(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        up = np.log(base / f_hi) + m - half
        down = np.log(f_lo / base) - m - half
    up, down = np.where(np.isfinite(up), up, -np.inf), np.where(np.isfinite(down), down, -np.inf)
    if not up.size:
        return None, -math.inf
    gu, gd = float(up.max()), float(down.max())
    if max(gu, gd) <= 0:
        return None, max(gu, gd)
    return ("above", gu) if gu >= gd else ("below", gd)


def step_filter(view, fs: FilterState, ev: EvalPoint, cfg: UpdateConfig) -> bool:
    """Feed one eval to the filter (False when it is not used: before the filter's first
    fraction, or a forecast or value that gives no finite log-ratio)."""
    if not (ev.e > 0 and ev.y > 0):
        return False
    d = math.log(ev.y / ev.e)
    if not usable(ev.f, d, cfg):
        return False
    _, lo, hi = view.expected(np.array([ev.f]), alert=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.log(hi / lo) / (2 * z_of(view.level))
    fs.step(ev.f, d, float(offset_var(np.array([ev.f]), _tau(view), cfg, w)[0]), cfg)
    return True


class HeadingRule(LossRule):
    name = "heading"
    kinds = ("heading", "cleared")
    description = ("the updated final-loss forecast's band (conditioned on the run's evals) no "
                   "longer overlapping the frozen final band")

    @dataclass(frozen=True)
    class Config(Smoothing, Persistence):
        """The persistence (``heading_k`` to raise, ``k_clear`` to clear) and what is compared; the
        updated forecast's own dials are ladder.predict.updated's (not registered per run)."""

        # the choices are bench/live_forecast.py's early_warning_table (docs/live_forecast.md): 45
        # synthetic faults, 127 healthy public curves
        heading_k: int = threshold(2, positive_int)  # evals apart before a warning: one fewer than
        #   the band rule's, the updated forecast being a filter already (k = 2 and 3: no false
        #   warning of 127; k = 2 no later than the band rule on 12 of 45 faults, k = 3 on 3)
        heading_against: str = threshold("alert", one_of("alert", "registered"))  # the frozen
        #   final band widened to the alert level as the band rule's (a healthy run ends outside
        #   the registered 90% band 1 time in 10), or as registered (2 false warnings of 127)
        heading_ahead: str = threshold("final", one_of("final", "curve"))  # the module doc
        heading_closing: str = threshold("count", one_of("count", "hold"))  # a closing gap: "hold"
        #   (neither raise nor clear) or "count" as any gap (with "curve", "hold" leaves 1 false
        #   warning of 127)

    @dataclass
    class State(Hysteresis):
        """The hysteresis (about: above or below) and the updated forecast's filter."""

        about: str | None = kept(("enum?", ("above", "below")))
        run: str | None = kept(("enum?", ("above", "below")))
        mean: float = kept("num?", 0.0)
        var: float | None = kept("num?")
        v_at: float | None = kept("num?")
        at: float = kept("num?", 0.0)
        n: int = kept("count", 0)
        recent: list = kept("nums", factory=list)
        last_z: float = kept("num?", 0.0)
        jump: float = kept("num?", 0.0)
        gap: float | None = kept("num?")  # the last eval's gap (log) while apart: closing?

        def filter(self) -> FilterState:
            return FilterState(self.mean or 0.0, self.var, self.v_at, self.at or 0.0, self.n,
                               list(self.recent), self.last_z or 0.0, self.jump or 0.0)

        def keep(self, fs: FilterState) -> None:
            self.mean, self.var, self.v_at, self.at, self.n, self.recent, self.last_z, self.jump = (
                fs.mean, fs.var, fs.v_at, fs.at, fs.n, list(fs.recent), fs.last_z, fs.jump)

    def judge(self, ctx: Context, cfg: Config, hs: State, ev: EvalPoint) -> None:
        view = ctx.view
        if not (math.isfinite(view.final) and math.isfinite(view.final_lo)
                and math.isfinite(view.final_hi) and view.final_lo < view.final < view.final_hi):
            return  # no final band registered: nothing to overlap
        ucfg = UpdateConfig()
        fs = hs.filter()
        if not step_filter(view, fs, ev, ucfg):
            return
        hs.keep(fs)
        u, lo, hi = updated_final(view, fs, ucfg)
        direction, gap = gap_ahead(view, fs, ucfg, cfg)
        closing = (direction is not None and hs.gap is not None and hs.run == direction
                   and gap < hs.gap)
        hs.gap = gap if direction else None
        if closing and cfg.heading_closing == "hold":
            if hs.level:
                return  # apart but coming back: neither raised further nor cleared
            direction = None
        hs.extend(direction)
        ch = hs.settle(1 if direction else 0, about=direction, k_raise=cfg.heading_k,
                       k_clear=cfg.k_clear)
        if ch is None:
            return
        extra = {"updated_final": u, "updated_lo": lo, "updated_hi": hi}
        what = "frozen final band" if cfg.heading_ahead == "final" else \
            "frozen band ahead of the run"
        if ch.kind == "raised":
            worse = "worse" if direction == "above" else "better"
            extra["gap_log"] = gap
            ctx.emit(Alert(ctx.stamp, ev.step, ev.tokens, ev.f, "heading",
                           "warn" if direction == "above" else "info", value=u,
                           expected=view.final, lo=view.final_lo, hi=view.final_hi,
                           direction=worse,
                           message=f"{view.metric}: the updated forecast (final {u:.4f} "
                                   f"[{lo:.4f}, {hi:.4f}], from {fs.n} evals to {ev.f:.1%} of "
                                   f"the run) no longer overlaps the {what} (by {gap:.2%} at "
                                   f"most; final {view.final:.4f} [{view.final_lo:.4f}, "
                                   f"{view.final_hi:.4f}] at {view.level:.0%}): heading {worse} "
                                   f"than registered, for {hs.run_len} evals", extra=extra))
        elif ch.kind == "cleared":
            ctx.emit(Alert(ctx.stamp, ev.step, ev.tokens, ev.f, "cleared", "info", value=u,
                           expected=view.final, lo=view.final_lo, hi=view.final_hi,
                           message=f"{view.metric}: the updated forecast (final {u:.4f} "
                                   f"[{lo:.4f}, {hi:.4f}]) overlaps the {what} again (was "
                                   f"heading {ch.about_before})",
                           extra={"key": view.metric, "clears": "heading", **extra}))

    def text(self, c: Config, level: float) -> str:
        what = ("final forecast" if c.heading_ahead == "final" else
                "forecast of the curve ahead (each point of the frozen grid after the last eval, "
                "and the final)")
        where = ("final band" if c.heading_ahead == "final" else "band at that point")
        against = (f"widened to the {c.alert_level:.0%} alert level (as the band rule widens "
                   f"the curve's)" if c.heading_against == "alert" else "as registered")
        closing = (" A gap that closes from one eval to the next neither counts toward the "
                   "warning nor clears it." if c.heading_closing == "hold" else "")
        return (f"Heading: the updated {what} (the frozen curve moved by the run's own evals, "
                f"ladder.predict.updated) with its {level:.0%} band apart from the frozen "
                f"{where} {against} for {c.heading_k} consecutive evals is a 'heading' warning "
                f"(info when better than registered); overlapping again for {c.k_clear} evals "
                f"clears it.{closing}")


def updated_forecast(view, section) -> dict | None:
    """The updated forecast as JSON (labelled "updated", beside the frozen numbers that never
    change) from the heading rule's section of a watcher state (a dict as saved, or the typed
    state); None before its first eval or without a registered final band."""
    if section is None or not hasattr(view, "final"):
        return None
    hs = section if isinstance(section, HeadingRule.State) else \
        HeadingRule.State.from_json(section, "state.heading")
    fs = hs.filter()
    if not fs.n or not (view.final_lo < view.final < view.final_hi):
        return None
    ucfg = UpdateConfig()
    u, lo, hi = updated_final(view, fs, ucfg)
    tau = _tau(view)
    lv = fs.level(tau)
    ahead, m, v = curve_ahead(lv, tau, view.fraction, view.lo, view.hi, view.level, ucfg)
    fx = view.fraction[ahead]
    z = z_of(view.level) * ucfg.inflation
    cy = view.loss[ahead] * np.exp(m)
    sd = np.sqrt(v)
    return {"label": "updated", "method": "ladder.predict.updated (end-anchored offset, Kalman)",
            "at_fraction": lv.at, "n_evals": lv.n, "level": view.level,
            "final": {"loss": u, "lo": lo, "hi": hi},
            "frozen_final": {"loss": view.final, "lo": view.final_lo, "hi": view.final_hi},
            "curve": [{"fraction": float(f), "loss": float(y), "lo": float(y * math.exp(-z * s)),
                       "hi": float(y * math.exp(z * s))} for f, y, s in zip(fx, cy, sd)]}
