"""The scoreboard that decides the defaults (bench/scoreboard.py, issue 35), the band's forecast
layer it chose (ladder.fit.result.shrink, band_prior_of), and a named law that stays itself
(``ladder fit --form chinchilla`` on Epoch's points gives Epoch's refit by default)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.scoreboard import (  # the repo root is on sys.path (pyproject: pythonpath)
    POWERS,
    PROTOCOL,
    VARIANTS,
    LadderScore,
    _decisions,
    compare,
    default_anchors,
    load_ladders,
    lolo_power,
    score_ladder,
)
from ladder.fit import fit_law, load_law, load_points
from ladder.fit.result import band_prior_of, shrink

ANCHORS = default_anchors()
needs_anchors = pytest.mark.skipif(not (ANCHORS / "gadre2024_overtraining").is_dir(),
                                   reason="shared/anchors not present")


def test_interval_score_by_hand():
    # y = 2: inside [1.8, 2.2] -> width 0.4 / 2; above hi 2.1 by 0.1 -> (0.2 + 20 x 0.1) / 2
    s = LadderScore("x", "v", y=[2.0, 2.0], pred=[2.0, 2.0], lo=[1.8, 1.9], hi=[2.2, 1.95])
    m = s.metrics()
    assert m["interval_score"] == pytest.approx(np.mean([0.4 / 2, (0.05 + 20 * 0.05) / 2]))
    assert m["coverage"] == 0.5
    assert m["half_width"] == pytest.approx(np.mean([0.2 / 2, 0.025 / 2]))
    # a ladder a variant cannot fit counts against it, never for it
    ok = {"x": s}
    failed = {"x": LadderScore("x", "w", error="InputError: no")}
    assert not compare(ok, failed)["passes"]
    assert compare(ok, failed)["worse_ladders"] == ["x: fails"]


def test_protocol_is_one_table_of_distinct_ladders():
    names = [p.ladder for p in PROTOCOL]
    assert len(names) == len(set(names)) >= 12
    assert all(p.fit in ("authors", "all") for p in PROTOCOL)


@given(own=st.floats(1e-4, 1.0), n=st.floats(0.5, 1e4), prior=st.floats(1e-4, 1.0),
       n0=st.floats(0.0, 1e3))
@settings(max_examples=200, deadline=None)
def test_shrink_lies_between_its_two_scales(own, n, prior, n0):
    v = shrink(own, n, prior, n0)
    assert min(own, prior) * (1 - 1e-12) <= v <= max(own, prior) * (1 + 1e-12)
    assert shrink(None, n, prior, n0) == prior          # nothing measured: the prior
    assert shrink(own, n, prior, 0.0) == pytest.approx(own)


@pytest.mark.parametrize("bad", [None, [], {"rate": 0.01}, {"noise_log_sd": "x", "rate": 0.1,
                                                              "weight": 9},
                                 {"noise_log_sd": math.nan, "rate": 0.1, "weight": 9},
                                 {"noise_log_sd": -1, "rate": 0.1, "weight": 9}])
def test_band_prior_of_ignores_what_is_not_one(bad):
    assert band_prior_of({"band_prior": bad}) is None


def _ladder(seed=0):
    """6 sizes x 2 token multiples of a known Chinchilla law with 0.5% noise."""
    rng = np.random.default_rng(seed)
    N = np.repeat(np.geomspace(2e7, 6e8, 6), 2)
    D = N * np.tile([20.0, 60.0], 6)
    L = (1.8 + 400 / N ** 0.34 + 1200 / D ** 0.3) * np.exp(rng.normal(0, 0.005, N.size))
    return pd.DataFrame({"run": [f"r{i}" for i in range(N.size)], "params": N, "tokens": D,
                         "compute": 6 * N * D, "loss": L})


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_band_prior_moves_the_band_not_the_estimates(tmp_path):
    df = load_points(_ladder())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = fit_law(df, form="chinchilla", bootstrap=0, band_prior=False)
        wide = fit_law(df, form="chinchilla", bootstrap=0,
                       band_prior={"noise_log_sd": 0.05, "rate": 0.05, "weight": 9.0})
    assert wide.params == own.params
    q = {"params": 3e9, "tokens": 6e10, "compute": 6 * 3e9 * 6e10}
    p0, p1 = own.predict(**q), wide.predict(**q)
    assert float(p0.loss) == float(p1.loss)
    assert float(p1.hi - p1.lo) > float(p0.hi - p0.lo)
    assert wide.diagnostics["forecast_layer"]["estimates"] == \
        "params are the form's own estimator"
    # law.json keeps the layer: the band read back is the band written
    path = tmp_path / "law.json"
    path.write_text(json.dumps(wide.to_json()))
    back = load_law(path)
    pb = back.predict(**q)
    assert float(pb.lo) == pytest.approx(float(p1.lo), rel=1e-12)
    assert float(pb.hi) == pytest.approx(float(p1.hi), rel=1e-12)
    assert "forecast layer" in back.report()


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_a_device_that_moves_the_estimates_keeps_the_estimator_on_record():
    """4 rungs over 2 decades of a known compute law (E 1.8), 0.3% noise, seed 3: E is not
    identified, and the asymptote rule (asked for on a named form; on by default with
    --form auto) centres on fixed E. The law says so, and keeps the form's own estimates."""
    rng = np.random.default_rng(3)
    C = np.logspace(18, 20, 4)
    L = (1.8 + 300.0 * C ** -0.12) * np.exp(0.003 * rng.standard_normal(4))
    df = pd.DataFrame({"run": [f"r{i}" for i in range(4)], "compute": C, "loss": L})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = fit_law(df, form="compute", bootstrap=0)
        ruled = fit_law(df, form="compute", bootstrap=0, asymptote_rule=True)
        auto = fit_law(df, bootstrap=0)
    assert plain.diagnostics["forecast_layer"] == {
        "estimates": "params are the form's own estimator"}
    assert ruled.params != plain.params
    for r in (ruled, auto):
        layer = r.diagnostics["forecast_layer"]
        assert layer["devices"] == ["asymptote_rule"]
        assert layer["estimator_params"] == pytest.approx(plain.params)
        assert "the form's own estimator" in r.report()


EPOCH = {"E": 1.8172, "alpha": 0.3473, "beta": 0.3672}   # anchors README: the exact grid fit


@pytest.mark.heavy  # 7 s on 2 busy cores
@needs_anchors
def test_named_form_is_epochs_refit_by_default(tmp_path):
    """`ladder fit --form chinchilla` with no other option on Epoch's 240 points gives Epoch's
    refit (Besiroglu et al. 2024; anchors/chinchilla_epoch/README)."""
    from bench.fit_speed import epoch_points
    from ladder.cli.main import main
    pts = tmp_path / "points.csv"
    epoch_points(ANCHORS).to_csv(pts, index=False)
    out = tmp_path / "law"
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["fit", str(pts), "--form", "chinchilla", "--bootstrap", "0",
                     "--out", str(out)])
    assert code == 0, err.getvalue()
    law = load_law(out / "law.json" if out.is_dir() else out)
    for k, v in EPOCH.items():
        assert law.params[k] == pytest.approx(v, abs=2e-3), k
    assert law.diagnostics["forecast_layer"]["estimates"] == \
        "params are the form's own estimator"


@needs_anchors
def test_smallest_protocol_scores():
    """Gadre et al.'s RedPajama ladder (5 runs, 3 targets), the plain variant: every target
    scored, its errors within the 1% issue 13 asks of this ladder."""
    name = "Gadre rpj"
    fit_df, targets = load_ladders(ANCHORS, [name])[name]
    s = score_ladder(name, fit_df, targets, VARIANTS["plain"], {"others": {}})
    assert s.ok, s.error
    m = s.metrics()
    assert m["n"] == 3 and m["max_abs"] < 0.01
    assert 0 < m["half_width"] and m["interval_score"] >= 2 * m["half_width"] * 0.999
    assert s.band_terms["dof"] >= 0
    # the band at every candidate power of the extrapolation term, from the same fit: its one
    # rollout fold held out a run 0.43 decades out; the targets are 1.2-2 decades out, where
    # the rate per decade (p = 1) widens the band beyond the held-out error itself (p = 0)
    assert set(s.power_grid) == {str(p) for p in POWERS}
    y = np.asarray(s.y)
    def width(pw):
        lo, hi = (np.asarray(v) for v in s.power_grid[pw])
        return (hi - lo) / y
    assert np.all(width("0.0") < width("1.0"))


def test_power_is_chosen_by_the_other_ladders():
    """lolo_power: each ladder's band at the power that scores best on the OTHER ladders. Two
    ladders are best narrow (p = 0), one is missed narrow and best wide: the two narrow ones
    each see one of each and take the wide band; the wide one sees two narrow ones and takes 0."""
    narrow = {str(p): ([0.9], [1.1]) for p in POWERS}
    narrow["0.0"] = ([0.99], [1.01])
    missed = dict(narrow, **{"0.0": ([1.05], [1.06])})
    def score(name, grid):
        return LadderScore(name, "v", y=[1.0], pred=[1.0], lo=[0.5], hi=[1.5],
                           power_grid={k: [list(a), list(b)] for k, (a, b) in grid.items()})
    out = lolo_power({"a": score("a", narrow), "b": score("b", narrow),
                      "c": score("c", missed)}, "lolo")
    assert out["c"].learned == {"power": 0.0} and out["c"].lo == [1.05]
    assert out["a"].learned["power"] > 0 and out["a"].lo == [0.9] and out["b"].hi == [1.1]
    # wide for a: its others' mean interval score at p = 0 is (0.02 + 1.01) / 2 > 0.2
    assert out["a"].metrics()["interval_score"] == pytest.approx(0.2)


@needs_anchors
@pytest.mark.slow
def test_full_scoreboard_defaults_are_calibrated_and_their_devices_earn_their_place(tmp_path):
    """Every ladder: the defaults' pooled 90% coverage within 80-97% (issue 35 item 3), and
    their forecast devices (--form auto's scale weights and asymptote rule) beat the plain
    estimator, and the one-SE form choice the lowest rollout error, on the aggregate interval
    score, as the decisions to keep them say (docs/scoreboard.md)."""
    from bench.scoreboard import aggregate, run_variant
    ladders = load_ladders(ANCHORS)
    new = aggregate(run_variant(VARIANTS["defaults"], ladders, tmp_path, log=lambda s: None))
    plain = aggregate(run_variant(VARIANTS["plain"], ladders, tmp_path, log=lambda s: None))
    assert new["failed"] == [] and new["ladders"] == len(ladders)
    assert 0.80 <= new["coverage_pooled"] <= 0.97
    assert new["interval_score"] < plain["interval_score"]
    # the one-SE form choice earns its place too (docs/scoreboard.md: 0.1044 against 0.1250)
    lowest = aggregate(run_variant(VARIANTS["no-one-se"], ladders, tmp_path, log=lambda s: None))
    assert new["interval_score"] < lowest["interval_score"]


@needs_anchors
@pytest.mark.heavy  # ~7 s on 2 busy cores
def test_the_one_se_switch_takes_the_lowest_rollout_form():
    """FitConfig.one_se_form (the scoreboard's variant ``no-one-se``): on Gadre et al.'s RPJ
    runs below the 1.4B targets the free form wins the rollout by noise (0.73% against the tied
    form's 0.83%, se 0.42%); the default takes the tied form, the switch the free one."""
    from bench.accuracy import ladder_tables
    from ladder.fit import fit_law, load_points
    runs = ladder_tables(ANCHORS)["Gadre rpj"][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one_se = fit_law(load_points(runs.copy()), bootstrap=0)
        lowest = fit_law(load_points(runs.copy()), bootstrap=0, one_se_form=False)
    assert one_se.diagnostics["auto"]["chosen"] == "chinchilla (alpha=beta)"
    cands = {r["form"]: r["rollout_mean_abs_final"] for r in lowest.diagnostics["auto"]
             ["candidates"] if r.get("rollout_mean_abs_final") is not None}
    assert lowest.diagnostics["auto"]["chosen"] == min(cands, key=cands.get) == "chinchilla"


def test_regenerating_the_tables_keeps_the_decisions(tmp_path):
    """--out rewrites the tables; the hand-written "## Decisions" section of the file it
    replaces (up to the next heading) is carried over, and a file without one gains none."""
    out = tmp_path / "scoreboard.md"
    assert _decisions(out) == ""
    out.write_text("# Scoreboard\n\nWritten by ...\n\n## Decisions\n\n| a | b |\n\nkept.\n\n"
                   "## Protocol\n\nold table\n")
    assert _decisions(out) == "## Decisions\n\n| a | b |\n\nkept.\n\n"
    out.write_text("# Scoreboard\n\n## Protocol\n\nold table\n")
    assert _decisions(out) == ""
