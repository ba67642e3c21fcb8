"""The short view of a fit (issue 38 items 3 and 4): what a notebook's repr and `ladder demo`
print, a dozen lines with the parameter table; the whole report behind `-v`. A shape factor at
its bound 0 says it is unused, a parameter the data leave free says NOT IDENTIFIED, and a
comparison with nothing held out is one line, not rows of n/a."""

from pathlib import Path

import pytest

from ladder.cli.demo import fit_summary
from ladder.fit import load_law
from ladder.fit.report import UNUSED, parameter_rows, short_lines

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def law():
    return load_law(DATA / "law_main_72fc951_compute.json")


def test_the_demo_prints_the_summary_and_the_whole_report_with_v(law, tmp_path):
    short = fit_summary(law, tmp_path / "law.json")
    assert short[:-1] == short_lines(law) and len(short) <= 20
    assert "ladder demo -v" in short[-1] and str(tmp_path / "law.json") in short[-1]
    assert fit_summary(law, tmp_path / "law.json", verbose=True) == law.report().splitlines()
    assert not any("max_iter" in ln or "n/a" in ln for ln in short)


def test_a_shape_factor_at_zero_and_an_unidentified_parameter_are_flagged(law):
    import dataclasses

    import numpy as np

    from ladder.fit.forms import Spec, get_form
    from ladder.fit.result import FitResult
    form = get_form("trajectory")
    u = np.array([p.to_u(v) for p, v in zip(form.params, (1.6, 1.0, 0.1, 0.3, 1e-12, 0.2,
                                                                 0.05), strict=True)])
    r = FitResult(spec=Spec(form), u=u, diagnostics={
        "identifiability": {"flags": {"E": ["its 90% interval reaches the bound"]},
                            "unidentified": ["E"]}})
    rows = {x["name"]: x for x in parameter_rows(r)}
    assert rows["c0"]["estimate"] < UNUSED and "unused" in rows["c0"]["note"]
    assert not rows["E"]["identified"] and all(rows[n]["identified"] for n in rows if n != "E")
    text = "\n".join(short_lines(r))
    assert "NOT IDENTIFIED" in text and text.count("NOT IDENTIFIED") == 1
    assert all(len(ln) <= 120 for ln in short_lines(r))
    assert "unused" in dataclasses.replace(r).report()
