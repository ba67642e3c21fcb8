"""One result type for every law (issue 16 item 1): a Chinchilla-family law and a curve law are
both ladder.fit.result.LawResult, with the same law.json envelope, the same report layout and one
reader that hands a file to the kind its form names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ladder.fit import LawResult, load_law
from ladder.fit.curve_law import CurveLaw
from ladder.fit.result import FitResult
from ladder.io import InputError

DATA = Path(__file__).parent / "data"
FILES = {"compute": "law_main_72fc951_compute.json", "mpl": "curvelaw_main_72fc951_mpl.json",
         "momentum": "curvelaw_main_72fc951_momentum.json"}
ENVELOPE = {"schema", "form", "expression", "params", "uncertainty", "metric", "conventions",
            "inputs", "diagnostics", "created", "tool_version"}


@pytest.mark.parametrize("form", sorted(FILES))
def test_every_kind_shares_the_envelope_and_the_report_layout(form):
    law = load_law(DATA / FILES[form])
    assert isinstance(law, LawResult)
    assert isinstance(law, CurveLaw if form in ("mpl", "momentum") else FitResult)
    obj = json.loads(json.dumps(law.to_json()))
    assert ENVELOPE <= set(obj)
    unc = obj["uncertainty"]
    assert unc["band_method"] == law.band_method and unc["level"] == law.level
    assert set(unc["intervals"]) == set(law.params)   # every parameter has its interval
    # written again, read again: the same law
    again = LawResult.from_json(obj)
    assert type(again) is type(law) and again.params == law.params
    assert again.created == law.created and again.tool_version == law.tool_version
    lines = law.report().splitlines()
    assert lines[0].startswith(f"law: {form}   ") and lines[1].startswith("metric: ")
    i = lines.index("parameters (90% intervals):")
    for k, name in enumerate(law.params):
        assert lines[i + 1 + k].split()[0] == name
    assert any(ln.startswith("solver: summed Huber(delta=0.001) on log loss = ") for ln in lines)
    assert any(ln.startswith("bootstrap: ") for ln in lines)


def test_a_curve_law_flags_a_parameter_its_replicates_run_to_a_bound():
    # the mpl file's beta replicates reach beta's lower bound 1e-3 (its 90% interval starts
    # there): the same flag a Chinchilla-family law raises, in report() and law.json
    law = load_law(DATA / FILES["mpl"])
    lo, _hi = law.intervals["beta"]
    assert lo == pytest.approx(1e-3, rel=1e-6)
    assert "beta" in law.identifiability["unidentified"]
    assert "NOT IDENTIFIED: beta: its 90% interval reaches the bound 0.001" in law.report()
    assert "beta" in law.to_json()["diagnostics"]["identifiability"]["flags"]


@pytest.mark.parametrize("mutate, field", [
    (lambda o: o.update(form="nope"), "form"),
    (lambda o: o.update(schema="law/2"), "schema"),
    (lambda o: o.pop("schema"), "schema"),
    (lambda o: o["uncertainty"].update(level=1.5), "uncertainty.level"),
])
@pytest.mark.parametrize("form", ["compute", "mpl"])
def test_the_reader_names_the_field_of_a_bad_file(form, mutate, field):
    obj = json.loads((DATA / FILES[form]).read_text())
    mutate(obj)
    with pytest.raises(InputError) as e:
        LawResult.from_json(obj, path="law.json")
    assert e.value.field == field and "law.json" in str(e.value)


# ----------------------------------------------------------------- one optimiser, one bootstrap

def test_the_batched_lbfgs_within_bounds_finds_the_constrained_optimum():
    # f(x) = sum_i (x_i - c_i)^2 / s_i^2 + x_0 x_1 / 4 in the box [0, 1]^2 x [-1, 3]: each row is
    # its own problem (its own centre c); the reference is scipy's L-BFGS-B on each row alone
    from scipy.optimize import minimize

    from ladder.fit.solver import lbfgs
    rng = np.random.default_rng(0)
    C = rng.uniform(-2, 3, (6, 3))
    s2 = np.array([1.0, 4.0, 0.25])
    lo, hi = np.array([0.0, 0.0, -1.0]), np.array([1.0, 1.0, 3.0])

    def fg(X, rows):
        d = X - C[rows]
        f = (d * d / s2).sum(axis=1) + X[:, 0] * X[:, 1] / 4
        g = 2 * d / s2
        g[:, 0] += X[:, 1] / 4
        g[:, 1] += X[:, 0] / 4
        return f, g

    r = lbfgs(fg, np.full((6, 3), 0.5), bounds=(lo, hi), gtol=1e-10, ftol=1e-15)
    assert r.converged.all()
    for i in range(6):
        ref = minimize(lambda x, i=i: fg(x[None], np.array([i]))[0][0], np.full(3, 0.5),
                       jac=lambda x, i=i: fg(x[None], np.array([i]))[1][0],
                       method="L-BFGS-B", bounds=list(zip(lo, hi)),
                       options={"ftol": 1e-15, "gtol": 1e-12})
        np.testing.assert_allclose(r.x[i], ref.x, atol=1e-7)
    assert np.all((r.x >= lo) & (r.x <= hi))
    assert np.any(r.x == lo) or np.any(r.x == hi)  # some rows' optima are on the box


def test_run_weights_and_percentile_interval():
    from ladder.fit.solver import percentile_interval, run_weights
    w = run_weights(np.random.default_rng(1), 5, 300)
    assert w.shape == (300, 5) and np.all(w > 0)
    np.testing.assert_allclose(w.sum(axis=1), 5.0)
    # multinomial: whole runs, counts that sum to the number of runs; a rule every replicate
    # must meet (here: run 0 drawn at least twice) is met, the few that never do are left out
    c = run_weights(np.random.default_rng(1), 4, 200, bayesian=False,
                    accept=lambda pick: (pick == 0).sum() >= 2, tries=3)
    assert 0 < len(c) < 200 and np.all(c.sum(axis=1) == 4) and np.all(c[:, 0] >= 2)
    assert np.array_equal(c, np.round(c))
    x = np.random.default_rng(2).standard_normal(10001)
    lo, hi = percentile_interval(x, 0.9)
    assert (lo, hi) == pytest.approx((np.percentile(x, 5), np.percentile(x, 95)), rel=1e-12)


def test_a_curve_fit_records_its_bootstrap_as_the_chinchilla_family_does():
    import warnings

    from test_curves_laws import MPL_TRUE, mpl_reference, table  # tests/ is on sys.path

    from ladder.fit.curve_fit import fit_curve_law
    train = table(mpl_reference, MPL_TRUE, ["cosine", "wsd", "wsd_long"], noise=1e-3, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_curve_law(train, "mpl", bootstrap=30, seed=2, n_starts=2)
    b = law.diagnostics["bootstrap"]
    assert b["replicates"] == 30 and b["valid"] == len(law.draws) == 30 - b["degenerate"]
    # 3 runs have 10 multisets: at most 10 distinct refits, each replicate one of them
    assert 1 <= b["distinct_refits"] <= 10 and 0 <= b["not_converged"] <= 30
    assert f"bootstrap: {b['valid']} of 30 run-level replicates usable" in law.report()
    assert LawResult.from_json(json.loads(json.dumps(law.to_json()))).diagnostics[
        "bootstrap"] == b


@pytest.mark.parametrize("form", sorted(FILES))
def test_every_kind_answers_the_one_query(form):
    """One law signature (issue 25): every kind is asked a ladder.fit.prediction.Query (or its
    fields as keywords, the same query) and answers a Prediction."""
    from ladder.fit.lr_schedules import parse_schedule
    from ladder.fit.prediction import Prediction, Query
    law = load_law(DATA / FILES[form])
    if form == "compute":
        q = Query(compute=np.array([1e19, 1e21]))
    else:
        q = Query(schedule=parse_schedule("linear:steps=400,peak=1e-3"), step=[100, 400],
                  active_params=5e7)
    a, b = law.predict(q, level=0.8), law.predict(level=0.8, **vars(q))
    assert isinstance(a, Prediction) and a.level == 0.8
    for k in ("loss", "lo", "hi"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    with pytest.raises(TypeError, match="not both"):
        law.predict(q, compute=1e20)
