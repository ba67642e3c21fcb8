"""The trajectory-capacity form: a capacity term that training does not remove plus a training
term along the run (issue 21: the cpu ladder's gap between sizes grows along the run, which the
trajectory form's one product A C_T^-alpha h(g) cannot follow)."""

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest

from ladder.fit import fit_law, load_law
from ladder.fit.forms import CURVES_FORMS, Spec, get_form
from ladder.io import InputError

TRUTH = {"E": 1.2, "A": 60.0, "alpha": 0.09, "B": 3.0, "beta": 0.02, "gamma": 0.3,
         "c0": 0.02, "c1": 0.4, "c2": 0.1}


def _h(g, t):
    return g ** -t["gamma"] * math.exp(t["c0"] * (1 / g - 1) + t["c1"] * (1 - g)
                                       + t["c2"] * (1 - g) ** 2)


def _loss(CT, g, t):
    return t["E"] + t["A"] * CT ** -t["alpha"] + t["B"] * CT ** -t["beta"] * _h(g, t)


def _table(truth=TRUTH, n_runs=4, noise=0.0, seed=0, span=(10, 12)):
    rng = np.random.default_rng(seed)
    rows = []
    for i, CT in enumerate(np.logspace(*span, n_runs)):
        for g in np.arange(1, 21) / 20:
            rows.append({"run": f"r{i}", "compute": CT * g, "fraction": g,
                         "loss": _loss(CT, g, truth) * math.exp(noise * rng.standard_normal())})
    return pd.DataFrame(rows)


def test_it_is_a_curves_form_and_four_runs_identify_it():
    form = get_form("trajectory-capacity")
    assert form.curves and "trajectory-capacity" in CURVES_FORMS and "trajectory" in CURVES_FORMS
    assert not get_form("compute").curves
    # each run's curve gives its constant part and the scale of its falling part apart
    assert Spec(form).n_across == 3 and Spec(get_form("trajectory")).n_across == 3
    with pytest.raises(InputError, match="cannot determine"):
        fit_law(_table(n_runs=2), form="trajectory-capacity", bootstrap=0, backtest=False)


@pytest.mark.heavy  # 10 s on 2 busy cores
def test_the_growing_gap_is_forecast_where_the_trajectory_form_misses_it():
    # truth: small runs plateau first (the capacity term), so the gap between sizes grows
    # along the run; fitted on 4 runs over 2 decades, forecast a run 0.5 decades beyond
    df = _table()
    CT = 10 ** 12.5
    g = np.arange(1, 21) / 20
    want = np.array([_loss(CT, x, TRUTH) for x in g])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cap = fit_law(df, form="trajectory-capacity", bootstrap=0, backtest=False,
                      asymptote_rule=False)
        one = fit_law(df, form="trajectory", bootstrap=0, backtest=False, asymptote_rule=False)
        got_cap = np.asarray(cap.predict(compute=CT * g, fraction=g).loss)
        got_one = np.asarray(one.predict(compute=CT * g, fraction=g).loss)
    err_cap = np.max(np.abs(got_cap / want - 1))
    err_one = np.max(np.abs(got_one / want - 1))
    assert err_cap < 0.003, err_cap
    assert err_one > 3 * err_cap          # the one-product form cannot follow the growing gap
    assert np.all(np.diff(got_cap) <= 0)  # monotone along the run by construction


@pytest.mark.heavy  # 8 s on 2 busy cores
def test_a_law_without_a_capacity_part_is_still_fitted():
    # the trajectory form's own truth (no capacity term): the form nests it (A C_T^-alpha ~ 0)
    truth = dict(TRUTH, A=1e-6)
    df = _table(truth)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit_law(df, form="trajectory-capacity", bootstrap=0, backtest=False,
                      asymptote_rule=False)
        CT = 10 ** 12.5
        got = float(res.predict(compute=CT, fraction=1.0).loss)
    assert got == pytest.approx(_loss(CT, 1.0, truth), rel=3e-3)


@pytest.mark.heavy  # 7 s on 2 busy cores
def test_law_json_round_trip_and_band(tmp_path):
    df = _table(noise=0.003, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit_law(df, form="trajectory-capacity", bootstrap=20, level=0.9, seed=0,
                      backtest=False)
    path = tmp_path / "law.json"
    path.write_text(json.dumps(res.to_json()))
    back = load_law(path)
    assert back.form == "trajectory-capacity"
    g = np.array([0.1, 0.5, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = res.predict(compute=3e12 * g, fraction=g), back.predict(compute=3e12 * g,
                                                                        fraction=g)
    np.testing.assert_allclose(np.asarray(a.loss), np.asarray(b.loss), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(a.lo), np.asarray(b.lo), rtol=1e-9)
    assert np.all(np.asarray(a.lo) < np.asarray(a.loss)) and np.all(
        np.asarray(a.loss) < np.asarray(a.hi))
