"""The law as a notebook meets it (issue 38 item 3): a short repr and an HTML parameter table for
every kind, ``predict`` on numbers (floats), arrays (arrays of their shape) and DataFrames (a
DataFrame on their index), and a plain ``loss`` column labelled ``loss``."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.fit import load_law
from ladder.fit.law import fit_law

DATA = Path(__file__).parent / "data"
LAWS = ["law_main_72fc951_compute.json", "curvelaw_main_72fc951_mpl.json",
        "curvelaw_main_72fc951_momentum.json"]


@pytest.fixture(scope="module")
def law():
    return load_law(DATA / LAWS[0])


@pytest.mark.parametrize("name", LAWS)
def test_every_kind_prints_short_with_its_parameter_table(name):
    law = load_law(DATA / name)
    text = repr(law)
    assert len(text.splitlines()) <= 20 and len(text) < 2000
    for p in law.params:
        assert any(ln.split()[:2] == [p, "="] for ln in text.splitlines())
    html = law._repr_html_()
    table = law.parameter_table()
    assert list(table.index) == list(law.params)
    assert list(table.columns) == ["estimate", "lo", "hi", "identified", "note"]
    assert table["estimate"].to_dict() == pytest.approx(law.params)
    assert html.count("<tr>") == len(law.params) + 1  # the header and one row each
    unidentified = set(law.identifiability.get("unidentified") or [])
    assert {n for n, ok in table["identified"].items() if not ok} <= unidentified | set(
        law.identifiability.get("flags") or {})


def test_a_scalar_question_gets_floats(law):
    p = law.predict(compute=1e21)
    assert all(type(x) is float for x in (p.loss, p.lo, p.hi))
    assert p.lo < p.loss < p.hi


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(1e18, 1e24), min_size=1, max_size=12))
def test_arrays_and_frames_get_answers_of_their_shape(law, computes):
    x = np.array(computes)
    p = law.predict(compute=x)
    assert p.loss.shape == x.shape and p.lo.shape == x.shape
    idx = [f"r{i}" for i in range(len(x))]
    frame = law.predict(pd.DataFrame({"compute": x, "other": 1.0}, index=idx))
    assert list(frame.index) == idx and list(frame.columns) == ["loss", "lo", "hi"]
    assert np.allclose(frame["loss"], p.loss, equal_nan=True)
    assert np.allclose(frame["hi"], p.hi, equal_nan=True)


def test_a_frame_without_any_input_column_is_refused_naming_them(law):
    from ladder.io import InputError
    with pytest.raises(InputError, match="compute"):
        law.predict(pd.DataFrame({"size": [1.0]}))


def test_a_plain_loss_column_keeps_its_name():
    C = np.geomspace(1e17, 1e20, 6)
    df = pd.DataFrame({"run": [f"r{i}" for i in range(6)], "compute": C,
                       "loss": 1.9 + 300 * C ** -0.14})
    assert fit_law(df, form="compute", bootstrap=0, backtest=False).metric == "loss"
    assert fit_law(df, form="compute", bootstrap=0, backtest=False,
                   metric="eval/loss").metric == "eval/loss"
