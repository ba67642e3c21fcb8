"""One result type for every law (issue 16 item 1): a Chinchilla-family law and a curve law are
both fit.result.LawResult, with the same law.json envelope, the same report layout and one
reader that hands a file to the kind its form names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fit import LawResult, load_law
from fit.curves import CurveLaw
from fit.result import FitResult
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
