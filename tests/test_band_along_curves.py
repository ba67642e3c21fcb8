"""Issue 35's synthetic ladder: a law of final points must not freeze a +-1% band along a curve
it never saw. Three runs with 20 evals each, loss = 1.7 + 410/N^0.34 + 400/D^0.28 along each run
(D the tokens so far), and a fourth, healthy run of the same law one rung up as the target.
Before the along-curve term the default fit (the compute form from the three finals) gave a
+-1.3% band that the target's first 20% sat above by 0.4-4.6% (docs/LOG.md 2026-12-07)."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.fit import fit_law, load_points
from ladder.fit.law import law_from_json
from ladder.fit.lawjson import pooled_record

E, A, ALPHA, B, BETA = 1.7, 410.0, 0.34, 400.0, 0.28   # the law
TOKENS_PER_PARAM = 20
EVALS = 20


def law(n, d):
    return E + A / n ** ALPHA + B / d ** BETA


def run(name: str, n: float) -> pd.DataFrame:
    d = TOKENS_PER_PARAM * n
    g = np.arange(1, EVALS + 1) / EVALS
    return pd.DataFrame({"run": name, "params": n, "active_params": n, "tokens": d * g,
                         "compute": 6 * n * d * g, "fraction": g, "loss": law(n, d * g)})


@pytest.fixture(scope="module")
def fitted():
    table = pd.concat([run(f"r{i}", n) for i, n in enumerate((50e6, 100e6, 200e6))],
                      ignore_index=True)
    return fit_law(load_points(table), bootstrap=100, seed=0)


def target_band(res):
    t = run("target", 400e6)
    p = res.predict(params=t["params"].to_numpy(), active_params=t["active_params"].to_numpy(),
                    tokens=t["tokens"].to_numpy(), compute=t["compute"].to_numpy(),
                    fraction=t["fraction"].to_numpy())
    return t, p


def test_healthy_target_run_stays_inside_the_default_band(fitted):
    t, p = target_band(fitted)
    y = t["loss"].to_numpy()
    early = t["fraction"].to_numpy() <= 0.2
    # the law of three finals misses the target's early part by 2-6% (a curve it never saw) ...
    assert np.all(np.abs(p.loss[early] / y[early] - 1) > 0.015)
    # ... and its band says so: every eval of the healthy run is inside it
    assert np.all((p.lo <= y) & (y <= p.hi))
    half_at_10 = float((p.hi[1] - p.lo[1]) / 2 / y[1])
    assert half_at_10 > 0.02


def test_the_watcher_raises_no_alarm_on_the_healthy_target(fitted):
    """End to end as the issue ran it: pre-register the target from the default fit and watch
    its 20 evals. The code before this band went critical (above_band) at 10% and cleared
    later (docs/LOG.md 2026-12-07)."""
    from ladder.predict.forecast import Target
    from ladder.predict.prereg import make_prereg
    from ladder.predict.watch import check
    n, steps = 400e6, 2000
    d = TOKENS_PER_PARAM * n
    evals = tuple(range(steps // EVALS, steps + 1, steps // EVALS))
    target = Target("target", n, n, d, steps, 6 * n * d, 2048, eval_steps=evals)
    doc = make_prereg(fitted, target, created="2026-01-01T00:00:00Z")
    rows = [{"step": s, "tokens": d * s / steps, "progress": s / steps, "time": 10.0 * s,
             fitted.metric: float(law(n, d * s / steps))} for s in evals]
    alerts = check(doc, rows, None, now=0).alerts
    assert [a for a in alerts if a.severity != "info"] == []


def test_the_along_curve_term_comes_from_the_held_out_run_and_survives_law_json(fitted):
    ex = fitted.diagnostics["backtest"]["extrapolation"]
    along = ex["along_curve"]
    assert along["fraction"][0] == pytest.approx(0.05) and len(along["fraction"]) == EVALS - 1
    # largest at the start of the curve, where a law of finals is furthest from a run's evals
    assert along["log_sd"][0] == max(along["log_sd"])
    back = law_from_json(fitted.to_json())
    _, p0 = target_band(fitted)
    _, p1 = target_band(back)
    np.testing.assert_allclose(p1.lo, p0.lo, rtol=1e-12)
    np.testing.assert_allclose(p1.hi, p0.hi, rtol=1e-12)


def test_a_named_form_keeps_the_rate_per_decade(fitted):
    table = pd.concat([run(f"r{i}", n) for i, n in enumerate((50e6, 100e6, 200e6))],
                      ignore_index=True)
    named = fit_law(load_points(table), form="compute", bootstrap=0, seed=0)
    assert "power" not in named.diagnostics["backtest"]["extrapolation"]
    assert fitted.diagnostics["backtest"]["extrapolation"]["power"] == 0.0


_num = st.one_of(st.none(), st.booleans(), st.text(max_size=3),
                 st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=60, deadline=None)
@given(power=_num, scale=_num, fr=st.one_of(_num, st.lists(_num, max_size=4)),
       sd=st.one_of(_num, st.lists(_num, max_size=4)))
def test_pooled_record_reads_any_power_fields_without_raising(power, scale, fr, sd):
    bt = {"extrapolation": {"ranges_log10": {"compute": [17.0, 18.0]}, "rate_per_decade": 0.01,
                            "power": power, "log_sd_scale": scale,
                            "along_curve": {"fraction": fr, "log_sd": sd}}}
    rec = pooled_record(bt)
    assert rec is not None and rec["rate"] == 0.01
    if "power" in rec:
        assert math.isfinite(rec["power"]) and rec["power"] >= 0
    if "along" in rec:
        assert len(rec["along"][0]) == len(rec["along"][1]) > 0
