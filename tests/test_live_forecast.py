"""The updated forecast (ladder.predict.updated) and the heading rule (issue 40 items 1-2)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import synthetic as sy
from ladder.predict.band import z_of
from ladder.predict.prereg import make_prereg
from ladder.predict.updated import (
    UpdateConfig,
    filter_offset,
    offset_var,
    prior_sd,
    update,
)
from ladder.predict.watch import check
from ladder.predict.watch.rules.heading import HeadingRule, updated_forecast
from ladder.predict.watch.view import PreregView

GRID = np.linspace(0.01, 1.0, 100)
FROZEN = 2.0 + 3.0 * GRID ** -0.3  # a falling curve; its band +-2% at the end, wider early
LO, HI = FROZEN * (1 - 0.02 / GRID ** 0.2), FROZEN * (1 + 0.02 / GRID ** 0.2)


def _upd(ex, ey, cfg=None):
    return update(GRID, FROZEN, LO, HI, FROZEN[-1], LO[-1], HI[-1], 0.9, ex, ey, cfg)


def test_no_evals_give_the_frozen_final_back():
    u = _upd([], [])
    assert u.n_evals == 0 and u.final == pytest.approx(FROZEN[-1])
    # the prior is the frozen band itself: the same band back (x inflation, log-symmetric)
    tau = prior_sd(FROZEN[-1], LO[-1], HI[-1], 0.9)
    assert u.hi == pytest.approx(FROZEN[-1] * math.exp(z_of(0.9) * UpdateConfig().inflation * tau))


def test_a_run_that_keeps_its_offset_is_followed():
    """Evals 3% above the frozen curve from 10% to 80%: the updated final moves most of the way
    (the frozen band's prior holds a little back) and its band covers the run's own line."""
    ex = GRID[(GRID >= 0.1) & (GRID <= 0.8)]
    u = _upd(ex, np.interp(ex, GRID, FROZEN) * 1.03)
    assert 1.02 < u.final / FROZEN[-1] < 1.031
    assert u.lo <= FROZEN[-1] * 1.03 <= u.hi
    assert u.fraction[0] > 0.8 and np.all(u.curve_lo < u.loss) and np.all(u.loss < u.curve_hi)


def test_filter_equals_the_gaussian_posterior():
    """The Kalman steps against the closed form: d = s1 + u + e with Cov(s(x), s(x')) =
    V(max(x, x')) (a process pinned at the end), e ~ N(0, r): posterior of s1 by linear algebra.
    The noise floor is set above the evals' own scatter, so r is the floor at every step."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0.05, 0.9, 12))
    d = 0.01 + 0.0005 * rng.standard_normal(12)
    cfg = UpdateConfig(q=3e-4, sigma_floor=0.01, band_weight=0.0, clock="log")
    tau = 0.008
    lv = filter_offset(x, d, tau, cfg)
    m, v = lv.predict(np.array([tau * tau]))
    V = tau ** 2 + cfg.q * -np.log(x)
    K = V[np.maximum.outer(np.arange(12), np.arange(12))] + cfg.sigma_floor ** 2 * np.eye(12)
    c = np.full(12, tau ** 2)
    w = np.linalg.solve(K, c)
    assert float(m[0]) == pytest.approx(float(w @ d), rel=1e-9)
    assert float(v[0]) == pytest.approx(tau ** 2 - float(w @ c), rel=1e-9)


def test_offset_var_is_pinned_at_the_end_and_never_rises_along_the_run():
    cfg = UpdateConfig()
    tau = prior_sd(FROZEN[-1], LO[-1], HI[-1], 0.9)
    v = offset_var(GRID, tau, cfg, np.log(HI / LO) / (2 * z_of(0.9)))
    assert np.all(np.diff(v) <= 1e-15) and v[-1] == pytest.approx(tau ** 2, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(-0.2, 0.2)), max_size=40),
       st.floats(0.001, 0.1))
def test_updated_band_holds_its_centre_for_any_evals(evals, half):
    """Any evals (including none, before the first fraction used, repeated fractions): a finite
    final inside its own band, the band as wide as the model says (never zero)."""
    lo, hi = FROZEN * (1 - half), FROZEN * (1 + half)
    ex = np.array([e[0] for e in evals])
    ey = np.interp(ex, GRID, FROZEN) * np.exp([e[1] for e in evals]) if evals else np.array([])
    u = update(GRID, FROZEN, lo, hi, FROZEN[-1], lo[-1], hi[-1], 0.9, ex, ey)
    assert math.isfinite(u.final) and u.lo < u.final < u.hi
    assert math.log(u.hi / u.final) == pytest.approx(math.log(u.final / u.lo), rel=1e-9)


def test_config_refuses_bad_dials():
    with pytest.raises(ValueError, match="q"):
        UpdateConfig(q=0.0)
    with pytest.raises(ValueError, match="clock"):
        UpdateConfig(clock="cubic")


TRUTH = sy.Truth()
TARGET = sy.ladder_targets(4, steps0=150)[-1]
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)
NOISE = sy.RunNoise(run_sigma=0.005, eval_sigma=0.003)


@pytest.fixture(scope="module")
def doc():
    return make_prereg(LAW, TARGET, eval_noise=NOISE.eval_sigma, created="2026-01-01T00:00:00Z")


def _first(alerts, kind):
    return next((a.fraction for a in alerts if a.kind == kind and a.severity != "info"), None)


@pytest.mark.parametrize("seed", range(1, 7))
def test_heading_is_silent_on_healthy_runs(doc, seed):
    rows = sy.make_run(TRUTH, TARGET, noise=NOISE, seed=seed).rows
    res = check(doc, rows, None, now=0.0)
    assert [a for a in res.alerts if a.kind == "heading"] == []


def test_heading_warns_on_a_drift_and_state_round_trips(doc):
    """A slow drift (loss rising linearly to +5% from 40% of the run): warned, with the updated
    final above the frozen band; the state saved midway and read back judges the same."""
    rows = sy.make_run(TRUTH, TARGET, noise=NOISE, fault=sy.Fault("drift", 0.4, 0.05),
                       seed=2).rows
    whole = check(doc, rows, None, now=0.0)
    heads = [a for a in whole.alerts if a.kind == "heading"]
    assert heads and heads[0].severity == "warn" and heads[0].value > doc["final"]["hi"]
    half = len(rows) // 2
    first = check(doc, rows[:half], None, now=0.0)
    saved = json.loads(json.dumps(first.state))
    second = check(doc, rows[half:], saved, now=0.0)
    got = [a for a in first.alerts + second.alerts if a.kind == "heading"]
    assert [(a.step, a.severity) for a in got] == [(a.step, a.severity) for a in heads]
    up = updated_forecast(PreregView.of(doc), whole.state["heading"])
    assert up["label"] == "updated" and up["final"]["loss"] > doc["final"]["hi"]
    assert up["frozen_final"]["loss"] == doc["final"]["loss"]


def _rule(doc, **params):
    return {**doc, "decision_rule": {**doc["decision_rule"], "parameters": {
        **doc["decision_rule"]["parameters"], **params}}}


@pytest.mark.parametrize("seed", (2, 3, 4))
def test_heading_warns_no_later_than_the_band_rule_on_a_shift(doc, seed):
    """A 2% shift from 30% of the run: the updated curve ahead (``heading_ahead`` "curve",
    opt-in) leaves the frozen band no later than the band rule warns; the updated final alone
    (the default, the one variant silent on every healthy public curve) warns later here, as the
    end-anchored forecast lets an early departure fade by the end (docs/live_forecast.md)."""
    rows = sy.make_run(TRUTH, TARGET, noise=NOISE, fault=sy.Fault("shift", 0.3, 0.02),
                       seed=seed).rows
    res = check(_rule(doc, heading_ahead="curve", heading_closing="hold"), rows, None, now=0.0)
    h, b = _first(res.alerts, "heading"), _first(res.alerts, "above_band")
    assert h is not None and b is not None and h <= b
    default = check(doc, rows, None, now=0.0)
    h_default = _first(default.alerts, "heading")
    assert h_default is None or h_default > b


def _transient_doc_and_rows(d):
    """A frozen curve with a 1% band (90%) at 1% of the run apart, and a run whose log offset
    to it is ``d(x)`` (a deterministic zigzag of 0.05% on top: an eval set's noise)."""
    x = np.round(np.arange(1, 101) / 100, 2)
    f = 2.0 + 2.0 * x ** -0.3
    steps = 10_000
    doc = {"schema": "prereg/1", "metric": "loss", "band_level": 0.9,
           "target": {"name": "t", "steps": steps, "tokens": 1.0},
           "forecast": [{"fraction": float(a), "step": int(round(a * steps)), "tokens": float(a),
                         "loss": float(v), "lo": float(v * math.exp(-0.01)),
                         "hi": float(v * math.exp(0.01))} for a, v in zip(x, f)],
           "final": {"loss": float(f[-1]), "lo": float(f[-1] * math.exp(-0.01)),
                     "hi": float(f[-1] * math.exp(0.01))},
           "decision_rule": {"parameters": {"align": "fraction"}}}
    y = f * np.exp(d(x) + 0.0005 * (-1.0) ** np.arange(x.size))
    rows = [{"step": int(round(a * steps)), "tokens": float(a), "progress": float(a),
             "time": 0.0, "loss": float(v)} for a, v in zip(x, y)]
    return doc, rows


def test_heading_holds_while_the_gap_closes():
    """A warmup transient (10% above the frozen curve at 2% of the run, its offset falling by
    e every 3% of the run), judged by the curve ahead (opt-in): the band rule warns, the
    heading rule does not (its gap closes at
    every eval: a run coming back is not heading outside); counted as any gap, it warns. A
    permanent 3% shift from 30% on, in the same setting, is warned by both, heading no later."""
    doc, rows = _transient_doc_and_rows(lambda x: 0.1 * np.exp(-(x - 0.02) / 0.03))
    curve = {"heading_ahead": "curve"}
    res = check(_rule(doc, **curve, heading_closing="hold"), rows, None, now=0.0)
    assert _first(res.alerts, "above_band") is not None
    assert _first(res.alerts, "heading") is None
    counted = check(_rule(doc, **curve, heading_closing="count"), rows, None, now=0.0)
    assert _first(counted.alerts, "heading") is not None
    doc, rows = _transient_doc_and_rows(lambda x: np.where(x >= 0.3, 0.03, 0.0))
    res = check(_rule(doc, **curve, heading_closing="hold"), rows, None, now=0.0)
    h, b = _first(res.alerts, "heading"), _first(res.alerts, "above_band")
    assert h is not None and b is not None and h <= b


def test_heading_state_refuses_a_damaged_section():
    with pytest.raises(ValueError, match="state.heading.var"):
        HeadingRule.State.from_json({"var": "x"}, "state.heading")


ANCHORS = Path(__file__).resolve().parents[2] / "shared" / "anchors"


def test_frozen_forecast_recovers_a_known_per_fraction_law():
    """bench/live_forecast.py's frozen forecast on curves made from log L = a(x) + b log N +
    c log D exactly: the held-out run's curve comes back, with a vanishing band."""
    from bench.live_forecast import Curve, frozen_forecast

    x = np.linspace(0.02, 1, 50)
    curves = []
    for i, (n, dd) in enumerate([(1e8, 1e9), (3e8, 2e9), (1e9, 5e9), (3e8, 8e9), (1e9, 1e10),
                                 (3e9, 3e10)]):
        y = np.exp(1.0 + 0.3 * x ** -0.2 - 0.05 * math.log(n) - 0.03 * math.log(dd))
        curves.append(Curve("g", f"r{i}", "c", math.log(n), math.log(dd), x, y))
    fr = frozen_forecast(curves[-1], curves[:-1], x)
    assert np.allclose(fr.loss, curves[-1].loss, rtol=1e-9)
    assert np.all(fr.hi / fr.lo - 1 < 1e-6)


@pytest.fixture
def watched(tmp_path, doc):
    from ladder.predict import prereg as pr

    prereg = tmp_path / "prereg.json"
    pr.write_once(prereg, doc)
    run = tmp_path / "target"
    run.mkdir()
    rows = sy.make_run(TRUTH, TARGET, noise=NOISE, seed=1,
                       fault=sy.Fault("shift", 0.3, 0.03)).rows
    half = [r for r in rows if r["progress"] <= 0.6]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in half))
    return prereg, run


def test_live_page_and_report_show_the_updated_forecast_beside_the_frozen(watched, doc):
    """The watcher's page draws the updated curve ahead and says its final beside the frozen
    one; the report computes the same from the artifacts (the same method, the same evals)."""
    from ladder.predict.live import Watcher
    from ladder.sources import JsonlSource
    from ladder.reports import updated
    from ladder.reports.inputs import load_inputs
    from ladder.reports.live import LivePage
    from ladder.reports.page import render_html, render_summary

    from ladder.reports.figdata import watch_data
    prereg, run = watched
    w = Watcher(prereg, JsonlSource(run / "metrics.jsonl"))
    page = LivePage.for_watcher(w, port=0, poll_ms=300)
    try:
        w.poll()
        snap = page.snapshot()
        seen = page.feed.inputs([])
    finally:
        page.close()
    up_line = [x for x in snap["verdict"] if x.startswith("Updated forecast")]
    assert len(up_line) == 1 and f"frozen {doc['final']['loss']:.4f}" in up_line[0]
    # the page's watch figure draws the curve ahead, beside the run's own evals
    d = watch_data(seen, updated.curve(updated.of_watcher(w)))
    assert d.updated.x.min() > 0.59 and len(d.fraction) > 50  # the curve ahead only

    inp = load_inputs(prereg=str(prereg), target_run=str(run))
    rep = updated.of_inputs(inp)
    live = updated.of_watcher(w)
    assert rep["label"] == live["label"] == "updated"
    assert rep["final"]["loss"] == pytest.approx(live["final"]["loss"], rel=1e-9)
    assert rep["final"]["loss"] > doc["final"]["hi"]  # a 3% shift from 30%: heading above
    html = render_html(inp, {}, {})
    assert "Updated forecast" in html and render_summary(inp, {}).count("Updated forecast") == 1


def test_transitions_on_a_change_of_known_effect():
    """bench/live_forecast.py's transitions on a made-up change whose effect (-3% x u, u the
    position in the change) is the same for every run: 'recipe' follows it exactly, 'anchor'
    keeps the old shape and misses by the effect, 'relax' starts at the old curve."""
    from bench.live_forecast import Change, transition_forecast

    def change(i, offset):
        t = np.arange(100.0, 2001.0, 100.0)
        o = 3.0 + 5.0 * t ** -0.3
        u = np.clip((t - 1000.0) / 1000.0, 0, 1)
        return Change("g", f"r{i}", "k", t, o * math.exp(offset) * np.exp(-0.03 * u), t, o,
                      1000.0, 2000.0)

    runs = [change(i, 0.01 * i) for i in range(3)]
    p, part = transition_forecast(runs[0], runs[1:], "recipe")
    after = runs[0].t > 1000
    assert np.allclose(p, runs[0].y[after], rtol=1e-12) and np.allclose(part, 0)
    a, _ = transition_forecast(runs[0], runs[1:], "anchor")
    assert a[-1] / runs[0].y[-1] == pytest.approx(math.exp(0.03))
    r, _ = transition_forecast(runs[0], runs[1:], "relax")
    assert runs[0].y[after][0] < r[0] < a[0] + 1e-12


def _change_of(i, effect, offset=0.0, key="k", group="g"):
    """A made-up run whose change at step 1000 (of 2000) multiplies its old plan's curve by
    exp(effect(u)), u its position in the change."""
    from bench.live_forecast import Change

    t = np.arange(100.0, 2001.0, 10.0)  # evals on the grid the effect is read on
    o = 3.0 + 5.0 * t ** -0.3
    u = np.clip((t - 1000.0) / 1000.0, 0, 1)
    return Change(group, f"r{i}", key, t, o * math.exp(offset) * np.exp(effect(u)), t, o,
                  1000.0, 2000.0)


def test_one_sibling_crossing_zero_gets_at_least_the_pooled_band():
    """One sibling whose effect (2% x sin(2 pi u)) crosses zero at u = 0.5: the change part of the
    band is the pooled spread x the effect's size everywhere, not |the effect| (which is 0 at
    the crossing); two siblings that disagree keep their own, wider interval."""
    from bench.live_forecast import change_half, pooled_relative_spread, relative_spreads

    def cross(u):
        return 0.02 * np.sin(2 * math.pi * u)

    run, sib = _change_of(0, cross), _change_of(1, cross, offset=0.01)
    u = np.linspace(0.0, 1.0, 41)
    pooled = 0.2
    grid = np.linspace(0.0, 1.0, 101)[1:]
    size = math.sqrt(np.mean(cross(grid) ** 2))  # rms of the effect over the change
    floor = z_of(0.9) * pooled * size * math.sqrt(2)
    half = change_half([sib], u, pooled)
    assert np.all(half >= floor * (1 - 1e-9))
    assert half[20] > 0.5 * floor > z_of(0.9) * math.sqrt(2) * abs(cross(u[20]))
    assert np.allclose(change_half([sib], u, 0.0), 0)  # one sibling has no spread of its own

    # two siblings with effects 2% u and 4% u: sd 1.41% u, far above a pooled 1% of 3% u
    two = [_change_of(2, lambda v: 0.02 * v, key="j"), _change_of(3, lambda v: 0.04 * v, key="j")]
    own = change_half(two, u, 0.01)
    assert own[-1] == pytest.approx(6.314 * 0.02 / math.sqrt(2) * math.sqrt(1.5), rel=1e-3)

    # relative spread of that pair: sd / |mean| = 0.01414 / 0.03; pooled leave-one-group-out
    rs = relative_spreads(two + [run, sib])
    assert rs["j"] == ("g", pytest.approx((0.02 / math.sqrt(2)) / 0.03, rel=1e-6))
    spreads = {"a": ("g1", 0.1), "b": ("g2", 0.3), "c": ("g2", 0.5)}
    assert pooled_relative_spread(spreads, "g2") == pytest.approx(0.1)
    assert pooled_relative_spread(spreads, "g1") == pytest.approx(0.4)
    assert pooled_relative_spread(spreads, "g3") == pytest.approx(0.3)
