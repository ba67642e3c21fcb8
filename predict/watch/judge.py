"""The judging loop: ``check(prereg, points, state) -> CheckResult(alerts, state)``, pure (no
file, clock or network access: the caller passes ``now``); it runs the rules of ``RULES`` in
order.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterable, Mapping

import numpy as np

from predict.watch.alerts import _SEV_RANK, Alert, CheckResult, new_state
from predict.watch.batch import Batch
from predict.watch.rules import RULES
from predict.watch.rules.loss import _judge_evals
from predict.watch.rules.run import _applicability_rule, _stalled_rule
from predict.watch.view import PreregView


def check(prereg: Mapping | PreregView, points: Batch | Iterable[Mapping], state: dict | None,
          *, now: float | None = None) -> CheckResult:
    """Judge new ``points`` against ``prereg``; returns the new alerts and the new state.

    Pure: ``state`` is not modified (a copy is returned), ``now`` (epoch seconds) is only used
    for alert times and the stalled rule. Passing the same points again after a restart with the
    returned state raises no alert twice: alerts fire on state changes only.
    """
    import copy

    from predict.watch import multi
    if isinstance(prereg, multi.MultiView) or multi.is_multi(prereg):
        mv = prereg if isinstance(prereg, multi.MultiView) else multi.MultiView.of(prereg)
        batch = points if isinstance(points, Batch) else Batch.from_rows(points)
        return multi.check_multi(mv, batch, state, now=_time.time() if now is None else now,
                                 single=check)
    view = prereg if isinstance(prereg, PreregView) else PreregView.of(prereg)
    st = copy.deepcopy(state) if state else new_state()
    now = _time.time() if now is None else float(now)
    stamp = _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(now))
    batch = points if isinstance(points, Batch) else Batch.from_rows(points)
    alerts: list[Alert] = []

    def emit(a: Alert):
        alerts.append(a)
        if a.severity != "info" and (st["worst"] is None
                                     or _SEV_RANK[a.severity] > _SEV_RANK[st["worst"]]):
            st["worst"] = a.severity

    if st.get("not_applicable"):
        return CheckResult([], st)

    if _applicability_rule(view, batch, st, emit, stamp):
        return CheckResult(alerts, st)

    if not len(batch):
        _stalled_rule(view, st, emit, stamp, now)
        return CheckResult(alerts, st)

    # rewinds: a resumed run re-logs steps; rows are judged in arrival order, last one wins
    if st["last_step"] is not None and batch.step[0] <= st["last_step"]:
        emit(Alert(stamp, int(batch.step[0]), None, None, "rewind", "info",
                   message=f"steps from {int(batch.step[0])} logged again (resumed run?); the "
                           f"new rows replace the earlier ones (last one wins)"))

    frac = _fractions(view, batch)
    tokens = batch.col("tokens")

    eval_rules = [r for r in RULES if r.scope == "eval"]
    for rule in RULES:  # in registry order: the order their alerts are listed in
        if rule.scope == "batch":
            rule.judge(view, batch, frac, tokens, st, emit, stamp)
        elif rule is eval_rules[0]:
            _judge_evals(eval_rules, view, batch, frac, tokens, st, emit, stamp)

    st["last_step"] = int(batch.step[-1])
    st["n_points"] += len(batch)
    st["last_point_time"] = now
    if st["stalled"]:
        st["stalled"] = False
        emit(Alert(stamp, int(batch.step[-1]), None, None, "stalled", "info",
                   message="new points arrive again (stall cleared)"))
    return CheckResult(alerts, st)


def stalled_check(prereg, state: dict, *, now: float) -> CheckResult:
    """The stalled rule alone (called by the follower between polls that brought nothing)."""
    import copy

    from predict.watch import multi
    view = prereg if isinstance(prereg, (PreregView, multi.MultiView)) else \
        (multi.MultiView.of(prereg) if multi.is_multi(prereg) else PreregView.of(prereg))
    return check(view, Batch.empty(), copy.deepcopy(state), now=now)


def row_fractions(view: PreregView, b: Batch) -> np.ndarray:
    """Where each row of ``b`` falls in the registered run (0..1), by the ``align`` rule."""
    return _fractions(view, b)


def _fractions(view: PreregView, b: Batch) -> np.ndarray:
    align = view.config.align
    tok = b.col("tokens")
    prog = b.col("progress")
    by_step = b.step.astype(float) / view.steps
    if align == "tokens":
        return tok / view.tokens
    if align == "step":
        return by_step
    if align == "fraction":
        return prog
    out = np.where(np.isfinite(tok), tok / view.tokens, by_step)
    return out
