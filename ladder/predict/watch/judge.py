"""The judging loop, :func:`check`: the rules of ``RULES`` in order, each with its own slice of
the thresholds and its own typed state."""

from __future__ import annotations

import math
import time as _time
from collections.abc import Iterable, Mapping

import numpy as np

from ladder.predict.watch.alerts import SEVERITY_RANK, Alert, CheckResult, finite_or_none
from ladder.sources.batch import Batch
from ladder.predict.watch.rules import RULES
from ladder.predict.watch.rules.base import Context
from ladder.predict.watch.rules.loss import BandRule, EvalPoint
from ladder.predict.watch.rules.run import ApplicabilityRule, InputRule, StalledRule
from ladder.predict.watch.state import WatchState
from ladder.predict.watch.view import PreregView


def check(prereg: Mapping | PreregView, points: Batch | Iterable[Mapping], state: dict | None,
          *, now: float | None = None) -> CheckResult:
    """Judge new ``points`` against ``prereg``: the new alerts and the new state. Pure:
    ``state`` is not modified, ``now`` (epoch seconds) is only used for alert times and the
    stalled rule. Alerts fire on state changes only, so the same points judged again with the
    returned state raise nothing twice."""
    from ladder.predict.watch import multi
    batch = points if isinstance(points, Batch) else Batch.from_rows(points)
    now = _time.time() if now is None else float(now)
    if isinstance(prereg, multi.MultiView) or multi.is_multi(prereg):
        mv = prereg if isinstance(prereg, multi.MultiView) else multi.MultiView.of(prereg)
        return multi.check_multi(mv, batch, state, now=now, single=check)
    view = prereg if isinstance(prereg, PreregView) else PreregView.of(prereg)
    ws = WatchState.read(state) if state else WatchState()
    stamp = _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(now))
    alerts: list[Alert] = []

    def emit(a: Alert):
        alerts.append(a)
        if a.severity != "info" and (ws.worst is None
                                     or SEVERITY_RANK[a.severity] > SEVERITY_RANK[ws.worst]):
            ws.worst = a.severity

    def done() -> CheckResult:
        return CheckResult(alerts, ws.to_json())

    if ws.not_applicable:
        return done()
    ctx = Context(view, batch, np.zeros(0), np.zeros(0), stamp, emit, ws)
    rules = {type(r): r for r in RULES}
    cfg = view.config
    if rules[ApplicabilityRule].judge(ctx, rules[ApplicabilityRule].config(cfg)):
        return done()
    if not len(batch):
        stalled = rules[StalledRule]
        stalled.idle(ctx, stalled.config(cfg), ws.of(stalled), now)
        return done()

    # rewinds: a resumed run re-logs steps; rows are judged in arrival order, last one wins
    rules[InputRule].rewind(ctx)
    ctx.frac = row_fractions(view, batch)
    ctx.tokens = batch.col("tokens")

    eval_rules = [r for r in RULES if r.scope == "eval"]
    for r in RULES:  # in registry order: the order their alerts are listed in
        if r.scope == "batch":
            r.judge(ctx, r.config(cfg), ws.of(r))
        elif r is eval_rules[0]:
            _judge_evals(ctx, eval_rules, rules[InputRule], rules[BandRule])

    ws.last_step = int(batch.step[-1])
    ws.n_points += len(batch)
    ws.last_point_time = now
    rules[StalledRule].arrived(ctx, ws.of(rules[StalledRule]))
    return done()


def _judge_evals(ctx: Context, rules: list, source: InputRule, band: BandRule) -> None:
    """The loss rules (scope "eval"), eval by eval in arrival order: the residual's EMA (kept
    in the band rule's state: the smoothed value the band judges) is updated once per eval and
    every rule sees the same :class:`EvalPoint`."""
    view, b, frac, ws = ctx.view, ctx.batch, ctx.frac, ctx.state
    y_all = source.metric(ctx, ws.of(source))
    if y_all is None:
        return
    smoothing = band.config(view.config)
    idx = np.flatnonzero(np.isfinite(y_all) & np.isfinite(frac)
                         & (frac >= smoothing.min_fraction - 1e-9))
    if not idx.size:
        return
    exp_all, lo_all, hi_all = view.expected(frac[idx])
    bs = ws.of(band)
    a = smoothing.ema_alpha
    judges = [(r.judge, r.config(view.config), ws.of(r)) for r in rules]
    for j, i in enumerate(idx):
        y, f = float(y_all[i]), float(frac[i])
        e, lo, hi = float(exp_all[j]), float(lo_all[j]), float(hi_all[j])
        if not (math.isfinite(e) and math.isfinite(lo) and math.isfinite(hi)):
            continue
        ws.n_evals += 1
        r = y - e
        bs.ema = r if bs.ema is None else a * r + (1 - a) * bs.ema
        ev = EvalPoint(step=int(b.step[i]), tokens=finite_or_none(ctx.tokens[i]), f=f, y=y, e=e,
                       lo=lo, hi=hi, r=r, ema=bs.ema)
        for judge, c, st in judges:
            judge(ctx, c, st, ev)


def row_fractions(view: PreregView, b: Batch) -> np.ndarray:
    """Where each row of ``b`` falls in the registered run (0..1), by the ``align`` rule."""
    align, tok = view.config.align, b.col("tokens")
    by_step = b.step.astype(float) / view.steps
    if align == "fraction":
        return b.col("progress")
    if align == "step":
        return by_step
    if align == "tokens":
        return tok / view.tokens
    return np.where(np.isfinite(tok), tok / view.tokens, by_step)  # "auto"
