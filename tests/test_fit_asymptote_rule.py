"""The short-ladder asymptote rule (fit.select.asymptote_rule) never centres the band on an
asymptote its own report calls implausible while a defensible variant has a plausible one, and
says which variant it chose and why (issue 21, item 5)."""

import json
import warnings

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fit import FitResult, fit_law
from fit.estimate import E_MIN_FRACTION_OF_LOSS, implausible_asymptote


def _short_ladder(seed, E, noise, n=4):
    """4 rungs over 2 decades of compute of L = E + 300 C^-0.12 with log-normal noise."""
    rng = np.random.default_rng(seed)
    C = np.logspace(18, 20, n)
    L = (E + 300.0 * C ** -0.12) * np.exp(noise * rng.standard_normal(n))
    return pd.DataFrame({"run": [f"r{i}" for i in range(n)], "compute": C, "loss": L})


def _plausible(E, df):
    return implausible_asymptote(E, float(df["loss"].min())) is None


def test_implausible_asymptote_bounds():
    assert implausible_asymptote(1.5, 2.0) is None
    assert "below 0.5 x the smallest loss" in implausible_asymptote(0.99, 2.0)
    assert "not below the smallest loss" in implausible_asymptote(2.0, 2.0)
    assert implausible_asymptote(E_MIN_FRACTION_OF_LOSS * 2.0, 2.0) is None


def test_a_defensible_plausible_variant_is_the_centre_over_an_implausible_best():
    """E = 0.6 against losses of 1.7-2.6 with 0.5% noise (seed 0): the free fit puts E at 0.50,
    below half the smallest loss, and has the lowest rollout error; the prior and fixed-E
    variants are within 3x of it. Main centred the band on the free E while its report said
    "NOT IDENTIFIED: ... implausible"; the centre is now the best plausible defensible variant,
    the free one stays in the pooled band, and the report and law.json say so."""
    df = _short_ladder(0, E=0.6, noise=0.005)
    res = fit_law(df, form="compute", bootstrap=60)
    rule = res.diagnostics["asymptote_rule"]
    assert rule["applied"]
    assert rule["lowest_rollout"] == "free"          # the case main got wrong
    assert "free" in rule["implausible"] and "implausible" in rule["implausible"]["free"]
    assert rule["chosen"] != "free" and rule["chosen"] in rule["defensible"]
    assert rule["centre_plausible"] and _plausible(res.params["E"], df)
    errs = rule["rollout_error"]
    ok = [k for k in rule["defensible"] if k not in rule["implausible"]]
    assert errs[rule["chosen"]] == min(errs[k] for k in ok)
    # the band holds the free variant's draws too (pooled): more rows than one variant's
    assert len(res.boot_u) > 60
    text = res.report()
    assert f"chose {rule['chosen']}" in text and "not free" in text
    assert "implausible" not in "\n".join(ln for ln in text.splitlines()
                                          if ln.strip().startswith("NOT IDENTIFIED"))
    back = FitResult.from_json(json.loads(json.dumps(res.to_json())))
    assert back.diagnostics["asymptote_rule"]["chosen"] == rule["chosen"]
    assert float(back.predict(compute=1e22).loss) == float(res.predict(compute=1e22).loss)


def test_with_no_plausible_defensible_variant_the_centre_stays_and_says_why():
    """E = 0.6, 0.5% noise, seed 1: the free fit (E = 0.16) is the only defensible variant
    (the prior and fixed ones miss their held-out rungs by 1.7-2.4% against 0.05%): it stays
    the centre, and the record says it is implausible and that nothing defensible was not."""
    df = _short_ladder(1, E=0.6, noise=0.005)
    res = fit_law(df, form="compute", bootstrap=0)
    rule = res.diagnostics["asymptote_rule"]
    assert rule["defensible"] == ["free"] and rule["chosen"] == "free"
    assert not rule["centre_plausible"]
    assert "no defensible variant has a plausible E" in rule["why"]
    assert "NOT IDENTIFIED: E" in res.report()


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), E=st.floats(0.2, 2.2), noise=st.floats(0.0, 0.01))
def test_the_centre_is_implausible_only_when_no_defensible_variant_is_plausible(seed, E, noise):
    df = _short_ladder(seed, E=E, noise=noise)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit_law(df, form="compute", bootstrap=0)
    rule = res.diagnostics.get("asymptote_rule") or {}
    if not rule.get("applied") or "defensible" not in rule:
        return
    centre_ok = rule["chosen"] not in rule["implausible"]
    assert centre_ok == _plausible(res.params["E"], df)
    if not centre_ok:
        assert all(k in rule["implausible"] for k in rule["defensible"]), rule
    assert rule["chosen"] in rule["defensible"]
