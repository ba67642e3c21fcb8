"""One registry of law forms (issue 38 item 4, issue 36): `fit --help`, the bad-form error and
what `--form auto` tries all come from ladder.fit.forms.REGISTRY, whose entries are the forms
each fitting module defines (the Chinchilla family here, the curve laws in fit.curve_forms, the
task law in fit.task_law) and every form law.json can hold."""

import contextlib
import io

import numpy as np
import pandas as pd
import pytest

from ladder.cli.main import main
from ladder.fit import curve_forms, forms, task_law
from ladder.fit.law import fit_law
from ladder.fit.result import LawResult
from ladder.fit.law import candidates
from ladder.io import InputError


def test_the_registry_is_every_form_the_modules_define_and_law_json_reads():
    reg = forms.REGISTRY
    assert {n for n, e in reg.items() if e.kind == "points"} == set(forms.FORMS)
    assert {n for n, e in reg.items() if e.kind == "curve"} == set(curve_forms.FORMS)
    assert {n for n, e in reg.items() if e.kind == "task"} == {task_law.FORM}
    assert set(LawResult._KINDS) == set(reg)
    for name, f in forms.FORMS.items():  # the form carries its columns and features
        assert reg[name].columns == f.needs and callable(f.featurize)


def _help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["fit", "--help"])
    return " ".join(out.getvalue().split())


def test_fit_help_and_the_bad_form_error_name_every_form():
    text = _help()
    with pytest.raises(InputError) as e:
        fit_law(pd.DataFrame({"run": ["a", "b"], "compute": [1e18, 1e19], "loss": [3.0, 2.5]}),
                form="no-such-form")
    for name in forms.REGISTRY:
        assert name in text, name
        assert name in str(e.value), name
    assert forms.form_choices() in text and forms.form_choices() in str(e.value)


def test_auto_tries_the_forms_the_registry_marks():
    """A table with every column: the candidates --form auto fits are the points forms marked
    auto (the curve laws, also marked, when the table is whole curves with their LR)."""
    rng = np.random.default_rng(0)
    rows = []
    for i, n in enumerate([1e7, 3e7, 1e8, 3e8]):
        for f in (0.25, 0.5, 0.75, 1.0):
            d = 20 * n * f * rng.uniform(0.8, 1.2)
            rows.append(dict(run=f"r{i}", params=n, active_params=n / 4, tokens=d,
                             compute=6 * n / 4 * d, fraction=f, loss=2 + 10 * (n * d) ** -0.1))
    got = {spec.form.name for _, spec in candidates(pd.DataFrame(rows), {}, {}, "params")}
    marked = {n for n, e in forms.REGISTRY.items() if e.auto and e.kind == "points"}
    assert got == marked
    assert {n for n, e in forms.REGISTRY.items() if e.auto and e.kind == "curve"} == \
        set(curve_forms.FORMS)
    assert not forms.REGISTRY["task"].auto and not forms.REGISTRY["trajectory-capacity"].auto
