"""predict.band, the band in one module: the law's band holds the law's own extrapolation term
(read from the law, never added twice), eval noise widens it in quadrature, an amendment's two
parts combine in quadrature in log units."""

import math
import warnings

import numpy as np
import pytest

from ladder.fit import fit_law
from tests import synthetic as sy
from ladder.predict.band import amended_band, extrapolation_error, law_band, z_of
from ladder.predict.forecast import Target, forecast

# a target two decades of compute beyond a 5-run synthetic ladder (its law extrapolates)
TARGET = Target(name="t", params=1e9, active_params=1e9, tokens=2e13, steps=1000,
                compute=1e23, seq_len=4096)


def _table():
    truth = sy.Truth()
    runs = [sy.make_run(truth, t, noise=sy.RunNoise(), seed=i)
            for i, t in enumerate(sy.ladder_targets(5, steps0=50))]
    df = sy.points_table(runs)
    return df[df["fraction"] >= 0.999]   # final points: a law of final points


@pytest.fixture(scope="module")
def laws():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {bt: fit_law(_table(), form="compute", bootstrap=30, seed=0, backtest=bt)
                for bt in (True, False)}


def test_normal_quantile():
    # Phi^-1(0.95) and Phi^-1(0.995), from the normal table
    assert z_of(0.9) == pytest.approx(1.6448536269514722, rel=1e-15)
    assert z_of(0.99) == pytest.approx(2.5758293035489004, rel=1e-15)


def test_the_forecast_adds_no_extrapolation_term_the_laws_band_holds_it(laws):
    law = laws[True]
    ex = extrapolation_error(law, TARGET)
    assert ex.in_law_band and ex.sigma_log > 0 and "rollout backtest" in ex.method
    # the term is the law's, at the target
    want = float(law.extrapolation_log_sd(params=TARGET.params, tokens=TARGET.tokens,
                                          compute=TARGET.compute, fraction=1.0,
                                          active_params=TARGET.active_params))
    assert ex.sigma_log == want
    # without eval noise the forecast's band is the law's band, to the bit: not widened again
    f = forecast(law, TARGET, level=0.9, eval_noise=0.0)
    loss, lo, hi = law_band(law, TARGET.at(f.fraction), 0.9)
    np.testing.assert_array_equal(f.lo, lo)
    np.testing.assert_array_equal(f.hi, hi)
    # and the law's band does hold the term: wider than the same band without it
    bare = law.predict(compute=TARGET.compute, extrapolation=False)
    assert f.final["hi"] > float(bare.hi) and f.final["lo"] < float(bare.lo)


def test_a_law_without_a_backtest_records_that_its_band_holds_no_extrapolation_term(laws):
    ex = extrapolation_error(laws[False], TARGET)
    assert ex.sigma_log == 0.0 and not ex.in_law_band and ex.method.startswith("none")


def test_a_law_that_measured_nothing_is_not_asked_for_its_term():
    """A law without a rollout backtest in its law.json (the synthetic truth, a curve law) has
    no extrapolation term to give, and none is asked of it."""
    ex = extrapolation_error(sy.TruthLaw(sy.Truth()), TARGET)
    assert (ex.sigma_log, ex.n, ex.in_law_band) == (0.0, 0, False)


def test_eval_noise_widens_the_forecast_in_quadrature(laws):
    law = laws[True]
    f0 = forecast(law, TARGET, level=0.9, eval_noise=0.0)
    f1 = forecast(law, TARGET, level=0.9, eval_noise=0.01)
    half0, half1 = f0.final["hi"] - f0.final["loss"], f1.final["hi"] - f1.final["loss"]
    assert half1 == pytest.approx(math.sqrt(half0 ** 2 + (1.6448536269514722 * 0.01) ** 2))


def test_an_amendments_band_combines_its_parts_in_quadrature_in_log_units():
    # hand-computed: the old band +5% at f and +3% at S leaves sqrt(0.05^2 - 0.03^2) = 0.04
    # (no eval noise); the change: evidence 2.0 between 1.9 and 2.1 at the band's level
    b = amended_band(np.array([0.05]), np.array([0.05]), 0.03, 0.03, level=0.9, eval_noise=0.0,
                     anchor_values=np.array([2.0]), evidence=np.array([2.0]),
                     evidence_lo=np.array([1.9]), evidence_hi=np.array([2.1]),
                     multiplier_level=None)
    assert b.law_up[0] == pytest.approx(0.04) and b.law_down[0] == pytest.approx(0.04)
    # the change's wider side, log(2/1.9) > log(2.1/2), on both sides (issue 40)
    assert b.change_up[0] == pytest.approx(math.log(2.0 / 1.9))
    assert b.change_down[0] == pytest.approx(math.log(2.0 / 1.9))
    lo, hi = b.bounds(np.array([2.0]))
    assert hi[0] == pytest.approx(2.0 * math.exp(math.sqrt(0.04 ** 2 + math.log(2 / 1.9) ** 2)))
    assert lo[0] == pytest.approx(2.0 * math.exp(-math.sqrt(0.04 ** 2 + math.log(2 / 1.9) ** 2)))
    # a multiplier interval at 80% is widened to the band's 90% by the quantile ratio
    b80 = amended_band(np.array([0.05]), np.array([0.05]), 0.03, 0.03, level=0.9,
                       eval_noise=0.0, anchor_values=np.array([2.0]), evidence=np.array([2.0]),
                       evidence_lo=np.array([1.9]), evidence_hi=np.array([2.1]),
                       multiplier_level=0.8)
    assert b80.change_up[0] == pytest.approx(math.log(2 / 1.9) * 1.6448536269514722
                                             / 1.2815515655446004)
