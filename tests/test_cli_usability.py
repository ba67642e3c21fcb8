"""Small things users hit (issue 24, item 6): the trainer's commands in the core install, global
options anywhere, one rung syntax, the OLS interval without statsmodels, a law's points on its
report."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.cli.main import build_parser, main
from ladder.specs import LADDERS, AmbiguousRung, resolve

ROOT = Path(__file__).resolve().parents[1]
TINY = LADDERS["tiny"]


@pytest.mark.heavy  # 11 s on 2 busy cores
@pytest.mark.parametrize("argv", [["run", "tiny", "--max-steps", "1"],
                                  ["plan", "tiny:" + TINY.rungs[0].name]])
def test_trainer_commands_without_the_train_extra_name_it(argv, tmp_path):
    """The core install has no JAX: one line naming the extra, exit 69, no traceback."""
    code = ("import sys; sys.modules['jax'] = None; sys.modules['jaxlib'] = None\n"
            "from ladder.cli.main import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, *argv, "--out" if argv[0] == "run" else
                        "--devices", str(tmp_path) if argv[0] == "run" else "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 69, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"ladder {argv[0]}: needs the 'train' extra: pip install 'ladder[train]'" in r.stderr


def test_global_options_anywhere_on_the_line():
    p = build_parser()
    for argv in (["-q", "list"], ["list", "-q"], ["list", "tiny", "--quiet"]):
        a = p.parse_args(argv)
        assert a.quiet is True and a.verbose == 0, argv
    assert p.parse_args(["list", "-vv"]).verbose == 2
    assert p.parse_args(["-v", "list"]).verbose == 1
    assert p.parse_args(["list"]).quiet is False
    a = p.parse_known_args(["run", "tiny", "-q", "--seed=3"])[0]
    assert a.quiet is True


def test_one_rung_syntax_everywhere():
    from ladder.cli.commands import resolve_target
    from ladder.io import InputError
    from ladder.cli.predict import target_rung
    r = TINY.rungs[1]
    for spec in (f"tiny:{r.name}", f"tiny/{r.name}", r.name):
        lad, rungs = resolve(spec)
        assert lad.name == "tiny" and rungs == [r], spec
        assert resolve_target(spec)[1] == [r]           # list, plan, run
        assert target_rung(spec) == r             # preregister --target
    assert resolve("tiny")[1] == list(TINY.all)
    with pytest.raises(InputError, match="expected one rung"):
        target_rung("tiny")
    # a rung name two ladders share must be named with its ladder
    import dataclasses
    two = dict(LADDERS, copy=dataclasses.replace(TINY, name="copy"))
    with pytest.raises(AmbiguousRung, match="copy:"):
        resolve(r.name, two)
    assert resolve(f"copy:{r.name}", two)[0].name == "copy"
    with pytest.raises(InputError, match="LADDER/RUNG") as e:
        resolve_target("no-such-rung")
    assert e.value.exit_code == 64


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 40), st.integers(0, 10_000), st.floats(0.01, 0.5))
def test_ols_interval_equals_statsmodels(n, seed, noise):
    """fit.estimate.ols (numpy + scipy) against statsmodels, the test oracle ([dev] extra)."""
    sm = pytest.importorskip("statsmodels.api")
    from ladder.fit.estimate import ols
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(40, 60, n))
    y = 4.0 - 0.05 * x + rng.normal(0, noise, n)
    X = np.column_stack([np.ones(n), x])
    ours, ref = ols(y, X), sm.OLS(y, X).fit()
    assert np.allclose(ours.params, ref.params, rtol=1e-10, atol=1e-12)
    assert np.allclose(ours.cov, ref.cov_params(), rtol=1e-10, atol=1e-14)
    assert np.allclose(ours.conf_int(0.1), ref.conf_int(alpha=0.1), rtol=1e-10, atol=1e-12)
    assert math.isclose(ours.ssr, ref.ssr, rel_tol=1e-10, abs_tol=1e-14)
    assert ours.df_resid == ref.df_resid
    assert math.isclose(ours.rsquared, ref.rsquared, rel_tol=1e-10, abs_tol=1e-12)


def test_the_core_install_leaves_statsmodels_out():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("statsmodels") for d in meta["dependencies"])
    assert any(d.startswith("statsmodels") for d in meta["optional-dependencies"]["dev"])
    src = (ROOT / "ladder" / "fit" / "estimate.py").read_text()
    assert "import statsmodels" not in src


def test_report_of_a_csv_fitted_law_draws_its_points(tmp_path, capsys):
    from tests import synthetic as sy
    from ladder.reports import plots
    from ladder.reports.inputs import load_inputs
    pts = sy.points_table([sy.make_run(sy.Truth(), t, seed=i)
                           for i, t in enumerate(sy.ladder_targets(4, steps0=60))])
    pts.to_csv(tmp_path / "pts.csv", index=False)
    law = tmp_path / "law.json"
    assert main(["fit", str(tmp_path / "pts.csv"), "--form", "compute", "--bootstrap", "0",
                 "--free-asymptote", "--out", str(law), "-q"]) == 0
    doc = json.loads(law.read_text())
    assert doc["points"]["n"] == len(pts) and len(doc["points"]["rows"]) == len(pts)
    finals = pts.sort_values("fraction").groupby("run").tail(1)

    def drawn(inp):
        fig = plots.plot_law(inp)
        assert fig is not None
        xs = [line.get_xdata() for line in fig.axes[0].lines
              if "fitted points" in str(line.get_label())]
        return sorted(np.asarray(xs[0], float)) if xs else []
    want = sorted(finals["compute"])
    assert drawn(load_inputs(law=law)) == pytest.approx(want)
    # an old law.json without points: the --points table draws them
    old = tmp_path / "old.json"
    doc.pop("points")
    old.write_text(json.dumps(doc))
    assert drawn(load_inputs(law=old)) == []
    assert drawn(load_inputs(law=old, points=tmp_path / "pts.csv")) == pytest.approx(want)
    assert main(["report", "--law", str(old), "--points", str(tmp_path / "pts.csv"),
                 "--out", str(tmp_path / "rep"), "-q"]) == 0
    assert (tmp_path / "rep" / "law.png").is_file()
