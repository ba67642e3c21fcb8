"""`ladder fit` / `ladder predict` end to end: runs directories, exit codes, law.json files."""

import contextlib
import io
import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import write_law_runs

from ladder.cli.main import main
from ladder.fit import load_law, load_points
from ladder.io import InputError


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    # `ladder fit` without --out writes ./law.json: never into the checkout
    monkeypatch.chdir(tmp_path)


def _cli(*args):
    """The CLI in-process (a subprocess costs seconds of imports); returns code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings():
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _write_runs(root, status="complete"):
    """The tiny ladder's runs on helpers.KNOWN_LAW; a constant train/loss far from it (the fit
    must read eval_dropless/loss) and a partial last line in every metrics.jsonl (ignored)."""
    lad = write_law_runs(root, status=status, train_loss=9.9)
    for rung in lad.rungs:
        with open(root / lad.name / rung.name / "metrics.jsonl", "a") as f:
            f.write('{"step": 99999, "tok')
    return lad


def test_runs_directory_becomes_points_with_counter_compute(tmp_path):
    lad = _write_runs(tmp_path)
    df = load_points([tmp_path])
    assert df["run"].nunique() == len(lad.rungs)
    r0 = lad.rungs[0]
    row = df[df.run == f"tiny/{r0.name}"].sort_values("fraction").iloc[-1]
    assert row["fraction"] == pytest.approx(1.0)
    assert row["compute"] == pytest.approx(r0.compute(r0.tokens), rel=1e-12)
    assert row["params"] == r0.params.total and row["active_params"] == r0.params.active
    assert len(df[df.run == f"tiny/{r0.name}"]) == len(r0.eval_steps())


def test_diverged_runs_are_excluded(tmp_path):
    _write_runs(tmp_path, status="diverged")
    with pytest.raises(InputError, match="no points"):
        load_points([tmp_path])


def test_fit_and_predict_commands(tmp_path):
    _write_runs(tmp_path)
    out = tmp_path / "law.json"
    r = _cli("fit", tmp_path, "--form", "compute", "--fix", "E=1.6", "--bootstrap", "30",
             "--out", out)
    assert r.returncode == 0, r.stderr
    assert "law: compute" in r.stdout
    law = load_law(out)
    assert law.metric == "eval_dropless/loss"
    assert law.params["alpha"] == pytest.approx(0.1, rel=1e-4)
    assert law.params["A"] == pytest.approx(40.0, rel=1e-3)
    r = _cli("predict", out, "--compute", "1e20")
    assert r.returncode == 0, r.stderr
    pred = json.loads(r.stdout)
    assert set(pred) == {"loss", "lo", "hi", "level"}
    assert pred["loss"] == pytest.approx(1.6 + 40.0 * 1e20 ** -0.1, rel=1e-4)


def test_exit_codes(tmp_path):
    assert _cli("fit", tmp_path / "nope.csv").returncode == 66
    pts = tmp_path / "p.csv"
    pts.write_text("run,compute,loss\na,1e19,3\nb,1e20,2.8\nc,1e21,2.6\nd,1e22,2.5\n")
    r = _cli("fit", pts, "--fix", "E")
    assert r.returncode == 64 and "NAME=VALUE" in r.stderr
    r = _cli("fit", pts, "--form", "nonsense")
    assert r.returncode == 65 and "unknown form" in r.stderr
    r = _cli("fit", pts, "--form", "chinchilla")
    assert r.returncode == 65 and "params" in r.stderr
    bad = tmp_path / "law.json"
    bad.write_text(json.dumps({"schema": "law/1", "form": "compute", "metric": "loss",
                               "uncertainty": {}, "fit": {"spec": {"form": "compute"},
                                                          "u": [1.0, 2.0]}}))
    r = _cli("predict", bad, "--compute", "1e20")
    assert r.returncode == 65 and "fit.u" in r.stderr
    assert not (tmp_path / "out.json").exists()


def test_predict_requires_the_law_inputs(tmp_path):
    pts = tmp_path / "p.csv"
    pts.write_text("run,compute,loss\na,1e19,3\nb,1e20,2.8\nc,1e21,2.6\nd,1e22,2.5\n")
    out = tmp_path / "law.json"
    assert _cli("fit", pts, "--form", "compute", "--bootstrap", "0", "--out", out).returncode == 0
    r = _cli("predict", out, "--params", "1e9")
    assert r.returncode == 65 and "--compute" in r.stderr


def test_fit_does_not_import_jax():
    code = ("import sys, ladder.fit, ladder.cli.fit, ladder.fit.law, ladder.fit.points, "
            "ladder.fit.backtest, ladder.fit.compare, ladder.fit.allocation, ladder.fit.lawjson; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nan_band_is_written_as_json(tmp_path):
    pts = tmp_path / "p.csv"
    pts.write_text("run,compute,loss\na,1e19,3\nb,1e21,2.6\n")
    out = tmp_path / "law.json"
    assert _cli("fit", pts, "--form", "compute", "--fix", "E=1.5", "--bootstrap", "0",
                "--out", out).returncode == 0
    r = _cli("predict", out, "--compute", "1e23")
    assert r.returncode == 0 and "band unavailable" in r.stderr
    pred = json.loads(r.stdout)
    assert math.isfinite(pred["loss"]) and pred["lo"] == "NaN" and pred["hi"] == "NaN"
    with pytest.warns(UserWarning, match="band unavailable"):
        assert np.isfinite(load_law(out).predict(compute=1e23).loss)


def test_cli_parity_with_the_real_ladders_method(tmp_path):
    """`--form compute --fix E=1.5 --by fraction --objective ols` is the real ladder's own fit;
    on its 4 final rung losses (fraction 1) it gives the published 2.039 at the hero's
    2.611e24 FLOPs."""
    pts = tmp_path / "real.csv"
    C = [2.650e19, 1.726e20, 1.381e21, 7.742e21]   # Marin's hero-run issue (tests/test_fit_law)
    L = [3.0154, 2.7809, 2.5638, 2.4087]
    pts.write_text("run,compute,fraction,loss\n"
                   + "".join(f"r{i},{c:g},1.0,{v}\n" for i, (c, v) in enumerate(zip(C, L))))
    out = tmp_path / "law.json"
    r = _cli("fit", pts, "--form", "compute", "--fix", "E=1.5", "--by", "fraction",
             "--objective", "ols", "--out", out)
    assert r.returncode == 0, r.stderr
    r = _cli("predict", out, "--compute", "2.611e24", "--fraction", "1.0")
    assert r.returncode == 0, r.stderr
    pred = json.loads(r.stdout)
    assert pred["loss"] == pytest.approx(2.039, abs=1e-3)
    assert pred["lo"] < pred["loss"] < pred["hi"]


def test_cli_prior(tmp_path):
    pts = tmp_path / "p.csv"
    pts.write_text("run,compute,loss\na,1e19,3\nb,1e20,2.8\nc,1e21,2.6\nd,1e22,2.5\n")
    r = _cli("fit", pts, "--form", "compute", "--prior", "E=1.5:0.2", "--bootstrap", "0")
    assert r.returncode == 0, r.stderr
    assert "(prior 1.5 +- 0.2)" in r.stdout
    r = _cli("fit", pts, "--form", "compute", "--prior", "E=1.5", "--bootstrap", "0")
    assert r.returncode == 64 and "NAME=MEAN:SD" in r.stderr
