"""A fit of a runs directory leaves the ladder's target rung out (issue 21, item 4): `ladder run
tiny` trains the target beside the rungs, and the law that forecasts it must not be fitted on it.
The output says so; --include-target puts it back."""

import json

import numpy as np
import pytest
from helpers import run_cli as _cli
from helpers import write_law_runs

from ladder.fit import load_points
from ladder.io import InputError


@pytest.fixture()
def runs(tmp_path):
    lad = write_law_runs(tmp_path / "runs", target=True)
    return tmp_path / "runs", f"tiny/{lad.target.name}", [f"tiny/{r.name}" for r in lad.rungs]


def test_points_of_a_runs_directory_leave_the_target_out(runs):
    root, target, rungs = runs
    df = load_points(root)
    assert sorted(df["run"].unique()) == sorted(rungs)
    assert df.attrs["left_out"] == [target]
    df = load_points(root, include_target=True)
    assert sorted(df["run"].unique()) == sorted(rungs + [target])
    assert df.attrs["left_out"] == []
    # the rung directories given one by one (as ladder/cli/demo.py does): nothing left out
    df = load_points([root / r for r in rungs])
    assert sorted(df["run"].unique()) == sorted(rungs) and df.attrs["left_out"] == []


def test_fit_says_what_it_left_out_and_include_target_puts_it_back(runs, tmp_path):
    root, target, _ = runs
    law = tmp_path / "law.json"
    code, out, err = _cli("fit", root, "--form", "compute", "--bootstrap", "0", "--out", law)
    assert code == 0, err
    assert f"left out: {target} (the ladder's target; --include-target to fit it)" in out
    assert "runs: 3" in out
    obj = json.loads(law.read_text())
    assert obj["inputs"]["n_runs"] == 3 and obj["inputs"]["left_out"] == [target]
    assert target not in obj["inputs"]["runs"]
    code, out, err = _cli("fit", root, "--form", "compute", "--bootstrap", "0",
                          "--include-target", "--out", law)
    assert code == 0, err
    assert "left out" not in out and "runs: 4" in out
    obj = json.loads(law.read_text())
    assert target in obj["inputs"]["runs"] and "left_out" not in obj["inputs"]


def test_a_directory_of_only_the_target_says_how_to_fit_it(runs, tmp_path):
    root, target, _ = runs
    only = root / target
    with pytest.raises(InputError, match="only runs are the ladder's target.*--include-target"):
        load_points(only)
    code, out, err = _cli("fit", only, "--form", "compute", "--out", tmp_path / "law.json")
    assert code == 65 and len(err.strip().splitlines()) == 1, err
    assert "--include-target" in err and not (tmp_path / "law.json").exists()


def test_a_fit_through_its_points_identifies_nothing():
    # 3 runs' finals, 3 free parameters (the tiny ladder with the compute form): the bootstrap's
    # interval is zero-wide, which must not read as "pinned down", so the short-ladder rule fits
    # E with a prior and fixed (and the band comes from those) instead of keeping a free E
    import pandas as pd

    from ladder.fit import fit_law

    c = np.array([1e12, 3e12, 9e12])
    df = pd.DataFrame({"run": ["a", "b", "c"], "compute": c, "fraction": 1.0,
                       "loss": 2.2 + 40 * c ** -0.15})
    free = fit_law(df, form="compute", bootstrap=20, asymptote_rule=False)
    flags = free.diagnostics["identifiability"]
    assert "E" in flags["unidentified"]
    assert any("no residual degrees of freedom" in w for w in flags["flags"]["E"])
    ruled = fit_law(df, form="compute", bootstrap=20, asymptote_rule=True)
    assert ruled.diagnostics["asymptote_rule"]["applied"]
