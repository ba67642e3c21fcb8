"""The loss rules, judged eval by eval on one shared :class:`EvalPoint` (the residual's EMA):
band (rule 1), trend (1b), rising (1c) and the contingency advisory (rule 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from predict.watch.alerts import _SEV_RANK, Alert, _opt
from predict.watch.batch import Batch
from predict.watch.config import WatchConfig
from predict.watch.view import PreregView, _f

# A source that reads the metric's key as a column (the watcher's key filter names it) yields an
# empty column when the key is never logged; by 10% of the run a rung has logged two evals (it
# evaluates every 5% by default: the trainer's TrainConfig.eval_every), so an empty column then
# means the key is missing.
_MISSING_METRIC_BY = 0.1


@dataclass
class EvalPoint:
    """One eval row as the loss rules see it: the metric ``y``, the forecast ``e`` and the alert
    band ``lo``..``hi`` at fraction ``f``, the raw residual ``r = y - e`` and its EMA ``ema`` (the
    smoothed value is ``e + ema``). ``raised`` is set by the band rule to the direction of an
    above/below-band alert it raised at this eval (the contingency rule follows it)."""

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


def _judge_evals(rules, view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """The loss rules, eval by eval in arrival order: the residual's EMA is updated once per eval
    and every rule of ``rules`` (scope "eval") sees the same :class:`EvalPoint`."""
    cfg = view.config
    y_all = b.cols.get(view.metric)
    if y_all is not None and not st.get("metric_seen"):
        if np.isfinite(y_all).any() or b.nonfinite.get(view.metric, np.zeros(0, bool)).any():
            st["metric_seen"] = True
        elif np.nanmax(frac, initial=0.0) >= _MISSING_METRIC_BY:
            y_all = None  # a source's column of the key, empty: as good as missing
    if y_all is None:
        if "missing_metric" not in st:
            st["missing_metric"] = True
            emit(Alert(stamp, int(b.step[-1]), None, None, "missing_metric", "info",
                       message=f"no '{view.metric}' in the rows read so far; loss is not compared "
                               f"until it appears (wrong --metric?)"))
        return
    idx = np.flatnonzero(np.isfinite(y_all) & np.isfinite(frac)
                         & (frac >= cfg.min_fraction - 1e-9))
    if not idx.size:
        return
    exp_all, lo_all, hi_all = view.expected(frac[idx])
    bs = st["band"]
    for j, i in enumerate(idx):
        y, f = float(y_all[i]), float(frac[i])
        e, lo, hi = float(exp_all[j]), float(lo_all[j]), float(hi_all[j])
        if not (math.isfinite(e) and math.isfinite(lo) and math.isfinite(hi)):
            continue
        st["n_evals"] += 1
        r = y - e
        bs["ema"] = r if bs["ema"] is None else cfg.ema_alpha * r + (1 - cfg.ema_alpha) * bs["ema"]
        ev = EvalPoint(step=int(b.step[i]), tokens=_opt(tokens[i]), f=f, y=y, e=e, lo=lo, hi=hi,
                       r=r, ema=bs["ema"])
        for rule in rules:
            rule.judge(view, st, ev, emit, stamp)


def _band_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 1: the smoothed metric outside the alert band, with hysteresis."""
    cfg = view.config
    bs = st["band"]
    f, e, lo, hi, y = ev.f, ev.e, ev.lo, ev.hi, ev.y
    ys = e + ev.ema
    direction = "above" if ys > hi else "below" if ys < lo else None
    if direction:
        half = (hi - e) if direction == "above" else (e - lo)
        excess = (ys - hi) if direction == "above" else (lo - ys)
        far = excess > cfg.far_factor * half
        if bs["run_dir"] == direction:
            bs["run_len"] += 1
        else:
            bs["run_dir"], bs["run_len"], bs["far_len"] = direction, 1, 0
        bs["far_len"] = bs["far_len"] + 1 if far else 0
        bs["in_len"] = 0
        want = None
        if bs["run_len"] >= cfg.k_consecutive:
            want = "warn"
        if bs["run_len"] >= cfg.k_critical or (bs["far_len"] >= cfg.k_far
                                                and bs["run_len"] >= min(cfg.k_far,
                                                                         cfg.k_consecutive)):
            want = "critical"
        cur = bs["level"] if bs["direction"] == direction else None
        if want and (cur is None or _SEV_RANK[want] > _SEV_RANK[cur]):
            bs["level"], bs["direction"] = want, direction
            why = (f"{bs['run_len']} consecutive evals" if want == "warn" else
                   "far outside the band" if bs["far_len"] >= cfg.k_far and
                   bs["run_len"] < cfg.k_critical else f"{bs['run_len']} consecutive evals")
            worse = "worse" if direction == "above" else "better"
            emit(Alert(stamp, ev.step, ev.tokens, f, f"{direction}_band", want,
                       value=ys, expected=e, lo=lo, hi=hi, direction=worse,
                       message=f"{view.metric} {ys:.4f} (smoothed; raw {y:.4f}) is {worse} "
                               f"than forecast {e:.4f} [{lo:.4f}, {hi:.4f}] at "
                               f"{cfg.alert_level:.0%}: {why}"))
            ev.raised = direction
    else:
        bs["run_dir"], bs["run_len"], bs["far_len"] = None, 0, 0
        bs["in_len"] += 1
        if bs["level"] is not None and bs["in_len"] >= cfg.k_clear:
            emit(Alert(stamp, ev.step, ev.tokens, f, "cleared", "info",
                       value=ys, expected=e, lo=lo, hi=hi, direction=None,
                       message=f"{view.metric} back inside the band for {bs['in_len']} evals "
                               f"(was {bs['direction']}_band, {bs['level']})",
                       extra={"key": view.metric, "clears": f"{bs['direction']}_band"}))
            bs["level"], bs["direction"] = None, None


def _contingency_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 4: an above_band alert raised inside the first ``contingency_fraction`` of the run
    (once per run): the contingency advisory."""
    bs = st["band"]
    if ev.raised == "above" and ev.f <= view.config.contingency_fraction \
            and not bs["contingency_sent"]:
        bs["contingency_sent"] = True
        emit(_contingency(view, ev.step, ev.tokens, ev.f, ev.e + ev.ema, ev.e, stamp))


def _rise_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 1c: the metric above its own running minimum for ``rise_k`` consecutive evals."""
    cfg = view.config
    f, y, step, tokens = ev.f, ev.y, ev.step, ev.tokens
    rs = st.setdefault("rise", {"min": None, "run_len": 0, "in_len": 0, "active": False})
    low = rs["min"]
    rs["min"] = y if low is None else min(low, y)
    if low is None or f < cfg.rise_after:
        return
    thr = max(cfg.rise_rel * low, cfg.rise_noise_k * view.eval_noise)
    if y - low > thr:
        rs["run_len"] += 1
        rs["in_len"] = 0
        if rs["run_len"] >= cfg.rise_k and not rs["active"]:
            rs["active"] = True
            emit(Alert(stamp, step, tokens, f, "rising", "warn", value=y, expected=low,
                       direction="worse",
                       message=f"{view.metric} {y:.4f} is {y / low - 1:+.2%} above its lowest "
                               f"value so far ({low:.4f}; threshold {thr:.4f}) for "
                               f"{rs['run_len']} consecutive evals: a healthy run's held-out "
                               f"loss does not rise", extra={"threshold": thr}))
    else:
        rs["run_len"] = 0
        if rs["active"]:
            rs["in_len"] += 1
            if rs["in_len"] >= cfg.k_clear:
                rs.update(active=False, in_len=0)
                emit(Alert(stamp, step, tokens, f, "cleared", "info", value=y, expected=low,
                           message=f"{view.metric} back within {thr:.4f} of its lowest value "
                                   f"(was rising)", extra={"key": view.metric, "clears": "rising"}))


def _trend_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 1b: the smoothed relative residual against its own median over an earlier window."""
    cfg = view.config
    f, rel, rel_smooth, step, tokens, e = ev.f, ev.r / ev.e, ev.ema / ev.e, ev.step, ev.tokens, ev.e
    ts = st.setdefault("trend", {"hist": [], "run_len": 0, "in_len": 0, "base": None,
                                 "dir": None})
    hist = ts["hist"]
    hist.append([f, rel])
    lo_f = f - cfg.trend_window - cfg.trend_gap
    while hist and hist[0][0] < lo_f - 1e-9:
        hist.pop(0)
    if f < cfg.trend_after:
        return
    if ts["dir"] is not None:  # alert active: clear when back near the level it left
        if abs(rel_smooth - ts["base"]) <= _trend_threshold(view, hist, f) / 2:
            ts["in_len"] += 1
            if ts["in_len"] >= cfg.k_clear:
                emit(Alert(stamp, step, tokens, f, "cleared", "info", value=e * (1 + rel_smooth),
                           expected=e, direction=None,
                           message=f"{view.metric} back within half the threshold of its "
                                   f"earlier level relative to the forecast (was trend, "
                                   f"{ts['dir']})", extra={"key": view.metric, "clears": "trend"}))
                ts.update(dir=None, base=None, in_len=0, run_len=0)
        else:
            ts["in_len"] = 0
        return
    base_vals = [v for g, v in hist if lo_f - 1e-9 <= g <= f - cfg.trend_gap + 1e-9]
    if len(base_vals) < 3:
        return
    base = float(np.median(base_vals))
    d = rel_smooth - base
    thr = _trend_threshold(view, hist, f)
    if abs(d) > thr:
        ts["run_len"] += 1
        if ts["run_len"] >= cfg.k_consecutive:
            worse = "worse" if d > 0 else "better"
            ts.update(dir=worse, base=base, in_len=0)
            # better than forecast is no risk to the run: recorded, not raised
            emit(Alert(stamp, step, tokens, f, "trend", "warn" if worse == "worse" else "info",
                       value=e * (1 + rel_smooth), expected=e * (1 + base), direction=worse,
                       message=f"{view.metric} moved {d:+.2%} of the forecast away from its own "
                               f"level over the preceding {cfg.trend_window:.0%} of the run "
                               f"({base:+.2%} -> {rel_smooth:+.2%} vs forecast; threshold "
                               f"{thr:.2%}): {worse}, for {ts['run_len']} evals",
                       extra={"threshold": thr}))
    else:
        ts["run_len"] = 0


def _trend_threshold(view: PreregView, hist: list, f: float) -> float:
    """The trend rule's threshold (relative to the forecast) at fraction ``f``: the largest of the
    configured floor, a share of the registered band's relative half-width, and a multiple of
    the smoothed residual's own noise. The noise is robust: 1.4826 x the median absolute first
    difference of the raw relative residuals / sqrt(2) (a slow drift barely changes first
    differences), scaled by the EMA's sd factor sqrt(alpha / (2 - alpha))."""
    cfg = view.config
    thr = max(cfg.trend_rel, cfg.trend_band * view.band_half_rel(f))
    if len(hist) >= 8:
        r = np.array([v for _, v in hist])
        sd = 1.4826 * float(np.median(np.abs(np.diff(r)))) / math.sqrt(2)
        a = cfg.ema_alpha
        thr = max(thr, cfg.trend_noise_k * sd * math.sqrt(a / (2 - a)))
    return thr


def _contingency(view: PreregView, step: int, tok: float | None, f, ys, e, stamp) -> Alert:
    """Projected final value if the run continues, and the token budget that would still reach the
    registered final value. The deviation is taken as a constant ratio of the loss to the
    forecast (the same relative offset to the end of the run); the budget comes from the
    pre-registration's ``budget_curve`` (the law's final loss against token budget)."""
    ratio = ys / e
    projected = view.final * ratio
    bc = view.budget
    budget_msg = "no budget curve in the pre-registration"
    needed = None
    mult = np.array([_f(v) for v in bc.get("multiplier", [])])
    fl = np.array([_f(v) for v in bc.get("loss", [])])
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
            budget_msg = (f"the registered final {view.final:.4f} would still be reached at about "
                          f"{needed:.2f}x the planned tokens ({needed * view.tokens:.3g} tokens)")
    if mult.size >= 2 and np.isfinite(fl).all():  # the law's finals for shorter plans
        short = [(m, x * ratio) for m, x in zip(mult, fl) if m < 1 and m in (0.5, 0.6, 0.7, 0.85)]
        if short:
            budget_msg += ("; shortened with the LR decay re-aimed to the new end: " + ", ".join(
                f"{m:g}x -> {x:.4f}" for m, x in short) + f" (as planned: {projected:.4f})")
    return Alert(stamp, step, tok, f, "contingency", "info", value=projected,
                 expected=view.final, lo=view.final_lo, hi=view.final_hi, direction="worse",
                 message=f"deviation confirmed at {f:.1%} of the token budget (inside the first "
                         f"{view.config.contingency_fraction:.0%}): if the run continues, final "
                         f"{view.metric} ~ {projected:.4f} vs registered {view.final:.4f}; "
                         f"{budget_msg}. Consider shortening and re-aiming the LR decay, then "
                         f"`ladder preregister --amend`.",
                 extra={"projected_final": projected, "budget_multiplier": needed})


def _words_band(c: WatchConfig, level: float) -> str:
    return (f"Loss: the eval metric's residual against the forecast, smoothed by an EMA "
            f"(alpha {c.ema_alpha}), outside the band widened from {level:.0%} to "
            f"{c.alert_level:.0%} (half-widths x z({c.alert_level})/z({level}), Gaussian) "
            f"for {c.k_consecutive} consecutive evals is a warning (above_band = worse than "
            f"forecast, below_band = better); outside for {c.k_critical} evals, or beyond the "
            f"band by {c.far_factor}x its half-width for {c.k_far} evals, is critical; inside "
            f"again for {c.k_clear} evals clears it. Evals before {c.min_fraction:.0%} of "
            f"the run are not compared.")


def _words_trend(c: WatchConfig, level: float) -> str:
    return (f"After {c.trend_after:.0%} of the run, the smoothed residual moving from its own "
            f"median over the preceding {c.trend_window:.0%} of the run (ending "
            f"{c.trend_gap:.0%} before) by more than the largest of {c.trend_rel:.0%} of the "
            f"forecast, {c.trend_band}x the band's relative half-width there and "
            f"{c.trend_noise_k}x the smoothed residual's own noise, for {c.k_consecutive} "
            f"evals, is a 'trend' warning when worse than forecast (info when better), cleared "
            f"when it is back within half that of the earlier level for {c.k_clear} evals.")


def _words_rise(c: WatchConfig, level: float) -> str:
    return (f"From {c.rise_after:.0%} of the run, the metric above its lowest value so far by "
            f"more than {c.rise_rel:.0%} of it (and {c.rise_noise_k}x the ladder's eval noise) "
            f"for {c.rise_k} consecutive evals is a 'rising' warning.")


def _words_contingency(c: WatchConfig, level: float) -> str:
    return (f"A confirmed above_band deviation inside the first {c.contingency_fraction:.0%} of "
            f"the token budget adds a contingency advisory.")
