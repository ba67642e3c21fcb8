"""Curve laws (fit.curve_forms, fit.curve_fit, fit.curve_law): exact against a naive reference,
recovery of known parameters from
synthetic curves, prediction of unseen schedules, transfer across model sizes, JSON round trip.

The synthetic truth is computed here by a deliberately naive per-step implementation of the two
papers' formulas (Luo et al. 2025 MPL; Tissue et al. 2024 momentum law), not by ladder/fit/.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from ladder.fit.curve_fit import fit_curve_law
from ladder.fit.curve_law import CurveLaw
from ladder.io import InputError
from helpers import predict_rung
from ladder.specs import Schedule

PEAK = 3e-3
STEPS = 600


def lr_of(kind: str, steps: int = STEPS, peak: float = PEAK, **kw) -> np.ndarray:
    s = Schedule(kind=kind, **kw)
    return np.array([peak * s.lr_frac(i, steps) for i in range(steps)])


def mpl_reference(lr, t_eval, p):
    """L(t) = L0 + A (sum_{s<=t} eta_s)^-alpha - B sum_{k=W+1..t} (eta_{k-1}-eta_k)
    (1 - (1 + C eta_k^-gamma S_k(t))^-beta), S_k(t) = sum_{tau=k..t} eta_tau; LRs in units of
    ``p['unit']``; W = first update at the maximum LR. Plain loops."""
    eta = np.asarray(lr, float) / p["unit"]
    W = int(np.argmax(eta >= eta.max() * (1 - 1e-9))) + 1
    out = []
    for t in t_eval:
        total = eta[:t].sum()
        ld = 0.0
        for k in range(W + 1, t + 1):
            drop = eta[k - 2] - eta[k - 1]
            if drop == 0.0:
                continue
            sk = eta[k - 1:t].sum()
            ld += drop * (1 - (1 + p["C"] * eta[k - 1] ** (-p["gamma"]) * sk) ** (-p["beta"]))
        out.append(p["L0"] + p["A"] * total ** (-p["alpha"]) - p["B"] * ld)
    return np.array(out)


def momentum_reference(lr, t_eval, p):
    """L = L0 + A S1^-alpha - C S2, S2 = sum_i m_i, m_i = lam m_{i-1} + (eta_{i-1} - eta_i) after
    warmup (Tissue et al. 2024). Plain recursion."""
    eta = np.asarray(lr, float) / p["unit"]
    W = int(np.argmax(eta >= eta.max() * (1 - 1e-9))) + 1
    m, s2, s1, out, want = 0.0, 0.0, 0.0, {}, {int(x) for x in t_eval}
    for i in range(1, len(eta) + 1):
        s1 += eta[i - 1]
        drop = eta[i - 2] - eta[i - 1] if i > W else 0.0
        m = p["lam"] * m + drop
        s2 += m
        if i in want:
            out[i] = p["L0"] + p["A"] * s1 ** (-p["alpha"]) - p["C"] * s2
    return np.array([out[int(t)] for t in t_eval])


MPL_TRUE = {"L0": 2.5, "A": 1.6, "alpha": 0.45, "B": 0.9, "C": 0.02, "beta": 0.6, "gamma": 0.5}
MOM_TRUE = {"L0": 2.5, "A": 1.6, "alpha": 0.45, "C": 2e-4, "lam": 0.99}
EVAL = np.arange(20, STEPS + 1, 20)
SCHEDS = {
    "cosine": {"kind": "cosine", "warmup": 0.02, "min_lr_frac": 0.1},
    "constant": {"kind": "constant", "warmup": 0.02},
    "wsd": {"kind": "wsd", "warmup": 0.02, "decay": 0.2, "min_lr_frac": 0.0},
    "linear_short": {"kind": "linear", "warmup": 0.02, "min_lr_frac": 0.05, "decay_end": 0.6},
    "wsd_long": {"kind": "wsd", "warmup": 0.02, "decay": 0.5, "min_lr_frac": 0.1},
}


def table(reference, truth, names, noise=0.0, seed=0, size=None, lr_every=2):
    rng = np.random.default_rng(seed)
    rows = []
    for n in names:
        lr = lr_of(**SCHEDS[n])
        y = reference(lr, EVAL, dict(truth, unit=PEAK))
        y = y * np.exp(noise * rng.standard_normal(y.size))
        # the loss every 20 steps; the LR every ``lr_every`` steps (rows without a loss give
        # only the LR, as a trainer's per-step optim/lr does)
        lr_steps = np.setdiff1d(np.arange(lr_every, STEPS + 1, lr_every), EVAL)
        steps = np.r_[EVAL, lr_steps]
        d = pd.DataFrame({"run": n if size is None else f"{n}@{size:g}", "step": steps,
                          "lr": lr[steps - 1], "loss": np.r_[y, np.full(lr_steps.size, np.nan)]})
        if size is not None:
            d["active_params"] = size
        rows.append(d)
    return pd.concat(rows, ignore_index=True)


def law_with(form, params, node_every=None):
    return CurveLaw(form=form, params=dict(params), lr_scale=PEAK, node_every=node_every)


@pytest.mark.parametrize("name", list(SCHEDS))
def test_mpl_matches_naive_reference(name):
    lr = lr_of(**SCHEDS[name])
    ref = mpl_reference(lr, EVAL, dict(MPL_TRUE, unit=PEAK))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exact = law_with("mpl", MPL_TRUE, node_every=1).predict(schedule=lr, step=EVAL).loss
        blocked = law_with("mpl", MPL_TRUE, node_every=16).predict(schedule=lr, step=EVAL).loss
    np.testing.assert_allclose(exact, ref, rtol=1e-10)
    np.testing.assert_allclose(blocked, ref, rtol=1e-4)   # block quadrature: small error


@pytest.mark.parametrize("name", ["cosine", "wsd", "linear_short"])
def test_momentum_matches_naive_reference(name):
    lr = lr_of(**SCHEDS[name])
    ref = momentum_reference(lr, EVAL, dict(MOM_TRUE, unit=PEAK))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exact = law_with("momentum", MOM_TRUE, node_every=1).predict(schedule=lr, step=EVAL).loss
    np.testing.assert_allclose(exact, ref, rtol=1e-10)


def test_mpl_recovers_parameters_and_predicts_unseen_schedules():
    train = table(mpl_reference, MPL_TRUE, ["cosine", "constant", "wsd"], noise=2e-4)
    law = fit_curve_law(train, "mpl", bootstrap=0)
    assert law.params["L0"] == pytest.approx(MPL_TRUE["L0"], rel=0.03)
    assert law.params["alpha"] == pytest.approx(MPL_TRUE["alpha"], rel=0.15)
    for name in ("linear_short", "wsd_long"):
        lr = lr_of(**SCHEDS[name])
        truth = mpl_reference(lr, EVAL, dict(MPL_TRUE, unit=PEAK))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pred = law.predict(schedule=lr, step=EVAL).loss
        assert np.max(np.abs(pred / truth - 1)) < 2e-3, name


def test_momentum_recovers_parameters():
    train = table(momentum_reference, MOM_TRUE, ["cosine", "constant", "wsd"], noise=1e-4)
    law = fit_curve_law(train, "momentum", bootstrap=0)
    assert law.params["lam"] == pytest.approx(MOM_TRUE["lam"], abs=3e-3)
    assert law.params["alpha"] == pytest.approx(MOM_TRUE["alpha"], rel=0.1)
    lr = lr_of(**SCHEDS["linear_short"])
    truth = momentum_reference(lr, EVAL, dict(MOM_TRUE, unit=PEAK))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = law.predict(schedule=lr, step=EVAL).loss
    assert np.max(np.abs(pred / truth - 1)) < 2e-3


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_size_transfer_predicts_a_larger_model_under_a_new_schedule():
    # truth: L0 and A power laws of size, shape shared (the assumption the transfer makes)
    def truth_at(n):
        r = n / 1e7
        return dict(MPL_TRUE, L0=2.5 * r ** -0.06, A=1.6 * r ** -0.1)
    frames = [table(mpl_reference, truth_at(n), ["cosine", "wsd"], noise=1e-4, seed=i, size=n)
              for i, n in enumerate((1e6, 3e6, 1e7))]
    law = fit_curve_law(pd.concat(frames, ignore_index=True), "mpl", bootstrap=0, n_starts=2)
    assert law.params["L0_size_exp"] == pytest.approx(-0.06, abs=0.01)
    target = 5e7
    lr = lr_of(**SCHEDS["linear_short"])
    truth = mpl_reference(lr, EVAL, dict(truth_at(target), unit=PEAK))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = law.predict(schedule=lr, step=EVAL, active_params=target).loss
    assert np.max(np.abs(pred / truth - 1)) < 3e-3
    assert {d["size"] for d in law.diagnostics["per_size"]} == {1e6, 3e6, 1e7}
    with pytest.raises(InputError, match="active-params"):
        law.predict(schedule=lr)                      # a scaled law needs the target size


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_bootstrap_band_contains_truth_and_json_round_trip():
    train = table(mpl_reference, MPL_TRUE, ["cosine", "constant", "wsd", "wsd_long"],
                  noise=1e-3, seed=3)
    law = fit_curve_law(train, "mpl", bootstrap=8, seed=1, level=0.9, n_starts=2)
    assert len(law.draws) == 8 and law.sigma > 0
    lr = lr_of(**SCHEDS["linear_short"])
    pred = law.predict(schedule=lr, step=EVAL)
    truth = mpl_reference(lr, EVAL, dict(MPL_TRUE, unit=PEAK))
    assert np.all(pred.lo < pred.loss) and np.all(pred.loss < pred.hi)
    assert np.mean((pred.lo <= truth) & (truth <= pred.hi)) > 0.9
    again = CurveLaw.from_json(law.to_json())
    p2 = again.predict(schedule=lr, step=EVAL)
    np.testing.assert_allclose(p2.loss, pred.loss, rtol=1e-12)
    np.testing.assert_allclose(p2.hi, pred.hi, rtol=1e-12)
    assert law.to_json()["schema"] == "law/3" and "mpl" in law.report()


def test_no_bootstrap_means_nan_band_with_warning():
    law = law_with("mpl", MPL_TRUE)
    with pytest.warns(UserWarning, match="band"):
        pred = law.predict(schedule="cosine:steps=300,peak=3e-3")
    assert np.all(np.isnan(pred.lo)) and np.all(np.isnan(pred.hi))
    assert pred.step[-1] == 300 and len(pred.step) == 100


def test_predict_rung_uses_the_shortened_schedule():
    import dataclasses

    from ladder.specs import get_ladder
    rung = get_ladder("tiny").target
    law = law_with("mpl", MPL_TRUE)
    short = dataclasses.replace(rung.schedule, decay_end=0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = predict_rung(law, rung)
        shortened = predict_rung(law, rung, short)
    lr = np.array([rung.peak_lr * short.lr_frac(i, rung.steps) for i in range(rung.steps)])
    ref = mpl_reference(lr, shortened.step, dict(MPL_TRUE, unit=PEAK))
    np.testing.assert_allclose(shortened.loss, ref, rtol=1e-4)
    assert not np.allclose(planned.loss, shortened.loss)


def test_eval_noise_widens_a_curve_laws_band_in_quadrature():
    """extra_log_sigma (every law's option: the forecaster's eval noise) is added to the curve
    law's residual sigma in quadrature: with draws that do not spread, the band's half-width in
    log space is z x sqrt(sigma^2 + extra^2) (Monte Carlo: within 10%); none added, the band
    is exactly the one without the option."""
    import dataclasses
    law = dataclasses.replace(law_with("mpl", MPL_TRUE), draws=[dict(MPL_TRUE)] * 20, sigma=0.01)
    lr = lr_of("cosine")
    base = law.predict(schedule=lr, step=EVAL)
    same = law.predict(schedule=lr, step=EVAL, extra_log_sigma=0.0)
    np.testing.assert_array_equal(base.hi, same.hi)
    wide = law.predict(schedule=lr, step=EVAL, extra_log_sigma=0.02)
    half = np.log(wide.hi / wide.loss)
    np.testing.assert_allclose(half, 1.6449 * math.hypot(0.01, 0.02), rtol=0.1)
    assert np.all(np.log(base.hi / base.loss) < half)


def test_a_planned_runs_tokens_set_its_length():
    """The forecaster's question of a curve law (ladder.fit.prediction.Query with a planned run's
    schedule and its tokens so far): the same schedule shape stretched to tokens / fraction, here
    0.6 of the planned tokens at the end of the run, as the naive reference computes it on the
    shorter schedule (the contingency "shorten the run, re-aim the decay")."""
    from ladder.fit.lr_schedules import NamedSchedule
    from ladder.fit.prediction import Query
    from ladder.specs import get_ladder
    rung = get_ladder("tiny").target
    law = law_with("mpl", MPL_TRUE)
    n = round(0.6 * rung.steps)
    q = Query(schedule=NamedSchedule.of_rung(rung), tokens=[0.6 * rung.tokens], fraction=[1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = law.predict(q)
        planned = law.on(NamedSchedule.of_rung(rung)).predict(fraction=[1.0])
    lr = np.array([rung.peak_lr * rung.schedule.lr_frac(i, n) for i in range(n)])
    np.testing.assert_allclose(got.loss, mpl_reference(lr, [n], dict(MPL_TRUE, unit=PEAK)),
                               rtol=1e-4)
    assert list(got.step) == [n] and list(planned.step) == [rung.steps]
    assert not np.allclose(got.loss, planned.loss)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.drop(columns="lr"), "lr"),
    (lambda d: d.drop(columns="run"), "run"),
    (lambda d: d.assign(loss=-1.0), "loss"),
    (lambda d: d.assign(step=0), "step"),
    (lambda d: d.assign(lr=-1e-3), "lr"),
])
def test_bad_tables_raise_input_error(mutate, field):
    good = table(mpl_reference, MPL_TRUE, ["cosine"])
    with pytest.raises(InputError) as e:
        fit_curve_law(mutate(good), "mpl", bootstrap=0)
    assert e.value.field == field


def test_bad_arguments_raise_input_error():
    good = table(mpl_reference, MPL_TRUE, ["cosine"])
    with pytest.raises(InputError, match="form"):
        fit_curve_law(good, "chinchilla")
    with pytest.raises(InputError, match="unknown parameter"):
        fit_curve_law(good, "mpl", fix={"E": 1.0})
    with pytest.raises(InputError):
        CurveLaw.from_json({"schema": "law/1", "form": "mpl", "params": {}, "curve": {}})
    with pytest.raises(InputError, match="steps"):
        law_with("mpl", MPL_TRUE).predict(schedule=np.full(10, 1e-3), step=[11])


def test_fixed_parameter_is_respected():
    train = table(mpl_reference, MPL_TRUE, ["cosine", "wsd"], noise=1e-4)
    law = fit_curve_law(train, "mpl", bootstrap=0, fix={"gamma": 0.5}, n_starts=1)
    assert law.params["gamma"] == 0.5 and law.fixed == {"gamma": 0.5}
    assert math.isfinite(law.params["L0"])


@pytest.mark.parametrize("form,truth", [("mpl", MPL_TRUE), ("momentum", MOM_TRUE)])
def test_analytic_gradient_matches_finite_differences(form, truth):
    """The solver's gradient (sparse annealing sums, reused buffers) against central
    differences of the objective, at a point away from the optimum."""
    from ladder.fit.curve_fit import _objective, _objective_grad, curve_data_from_table
    from ladder.fit.curve_forms import CurveModel as _Model
    from ladder.fit.curve_forms import design as _design
    from ladder.fit.curve_forms import stack as _stack
    df = table(mpl_reference if form == "mpl" else momentum_reference, truth,
               ["cosine", "wsd"], noise=1e-3)
    data = curve_data_from_table(df, size_column=None)
    runs = _stack([_design(n, lr, t, y, 1.0, PEAK, None)
                   for n, lr, t, y in zip(data.names, data.lr, data.steps, data.loss,
                                          strict=True)])
    model = _Model(form, (), None, {})
    u = model.u_of({k: v * 1.07 if k != "lam" else v for k, v in truth.items()})
    _, g = _objective_grad(model, u, runs, 1e-3)
    for i in range(len(u)):
        h = 1e-6 * max(1.0, abs(u[i]))
        up, dn = u.copy(), u.copy()
        up[i] += h
        dn[i] -= h
        fd = (_objective(model, up, runs, 1e-3) - _objective(model, dn, runs, 1e-3)) / (2 * h)
        assert g[i] == pytest.approx(fd, rel=1e-5, abs=1e-9), model.names[i]


@pytest.mark.heavy  # 7 s on 2 busy cores
def test_one_size_needs_no_size_column():
    """A points table of one model size (load_points always carries an empty active_params
    column) fits without a size column, exactly as a table without that column."""
    from ladder.fit import fit_law, load_points
    df = table(mpl_reference, MPL_TRUE, ["cosine", "constant", "wsd"], noise=2e-4)
    df = df[df["loss"].notna()].reset_index(drop=True)   # a points table: eval rows only
    pts = load_points(df)
    assert pts["active_params"].isna().all()
    law = fit_law(pts, form="mpl", bootstrap=0)
    bare = fit_curve_law(df, "mpl", bootstrap=0)
    assert law.size_variable is None
    for k, v in bare.params.items():
        assert law.params[k] == pytest.approx(v, rel=1e-9), k


@pytest.mark.heavy  # 11 s on 2 busy cores
def test_auto_on_a_table_of_curves_considers_the_curve_laws():
    """--form auto on curves with step and lr but no scale columns chooses between mpl and
    momentum by leave-one-run-out; on multi-power-law data it picks mpl and says why."""
    from ladder.fit import fit_law
    df = table(mpl_reference, MPL_TRUE, ["cosine", "constant", "wsd"], noise=2e-4)
    df = df[df["loss"].notna()].reset_index(drop=True)
    law = fit_law(df, form="auto", bootstrap=0)
    auto = law.diagnostics["auto"]
    assert law.form == "mpl" and auto["chosen"] == "mpl"
    errs = {c["form"]: c["leave_one_run_out_mean_abs_curve"] for c in auto["candidates"]}
    assert set(errs) == {"mpl", "momentum"} and errs["mpl"] < errs["momentum"]
    assert "form chosen by --form auto: mpl" in law.report()
