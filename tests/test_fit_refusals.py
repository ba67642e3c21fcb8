"""No quiet failures (issue 13): a law from an unconverged solver, a pre-registration without a
band and a watch that judged nothing each exit 65 with one line, unless explicitly allowed."""

import json
import subprocess

import pytest
from helpers import run_cli

import ladder.fit.estimate
import ladder.fit.law
import ladder.fit.solver
from ladder.specs import LADDERS

TARGET = f"cpu:{LADDERS['cpu'].target.name}"


def _cli(*args):
    code, out, err = run_cli(*args)
    return subprocess.CompletedProcess(args, code, out, err)


def _points(tmp_path, n=4):
    p = tmp_path / f"p{n}.csv"
    C = [1e10, 1e11, 1e12, 1e13][:n]
    rows = "".join(f"r{i},{c:g},{1.5 + 60 * c ** -0.12:.6f}\n" for i, c in enumerate(C))
    p.write_text("run,compute,loss\n" + rows)
    return p


def test_fit_refuses_an_unconverged_best_start(tmp_path, monkeypatch):
    pts = _points(tmp_path)
    # a solver allowed 2 iterations, in the screen of the grid's starts and in the polish
    # (which decides), cannot converge
    orig = ladder.fit.solver.lbfgs

    def short(*a, **kw):
        return orig(*a, **dict(kw, max_iter=2))
    monkeypatch.setattr(ladder.fit.estimate, "lbfgs", short)
    monkeypatch.setattr(ladder.fit.solver, "lbfgs", short)
    out = tmp_path / "law.json"
    r = _cli("fit", pts, "--form", "compute", "--bootstrap", "0", "--out", out)
    assert r.returncode == 65, r.stderr
    msg = r.stderr.strip().splitlines()[-1]
    assert "did not converge" in msg and "--allow-unconverged" in msg
    assert not out.exists()
    r = _cli("fit", pts, "--form", "compute", "--bootstrap", "0", "--allow-unconverged",
             "--out", out)
    assert r.returncode == 0 and out.exists()
    assert json.loads(out.read_text())["diagnostics"]["converged"] is False


def test_fit_converged_is_written(tmp_path):
    out = tmp_path / "law.json"
    r = _cli("fit", _points(tmp_path), "--form", "compute", "--bootstrap", "0", "--out", out)
    assert r.returncode == 0 and out.exists(), r.stderr


def test_preregister_refuses_an_all_nan_band(tmp_path):
    law = tmp_path / "law.json"
    # 2 points, E fixed: no residual degrees of freedom, so no band anywhere
    assert _cli("fit", _points(tmp_path, 2), "--form", "compute", "--fix", "E=1.5",
                "--bootstrap", "0", "--out", law).returncode == 0
    out = tmp_path / "prereg.json"
    r = _cli("preregister", law, "--target", TARGET, "--out", out)
    assert r.returncode == 65, r.stderr
    assert "no band" in r.stderr and "--allow-no-band" in r.stderr
    assert not out.exists()
    r = _cli("preregister", law, "--target", TARGET, "--allow-no-band", "--out", out)
    assert r.returncode == 0 and out.exists(), r.stderr


@pytest.fixture()
def prereg(tmp_path):
    law = tmp_path / "law.json"
    assert _cli("fit", _points(tmp_path), "--form", "compute", "--fix", "E=1.5",
                "--bootstrap", "0", "--out", law).returncode == 0
    out = tmp_path / "prereg.json"
    assert _cli("preregister", law, "--target", TARGET, "--out", out).returncode == 0
    return out


def test_watch_exits_65_when_it_judged_no_eval_and_names_the_keys(tmp_path, prereg):
    t = LADDERS["cpu"].target
    src = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "tokens": s * t.tokens // t.steps, "progress": s / t.steps,
                         "time": float(s), "eval/loss": 3.0, "train/loss": 3.1})
             for s in range(40, t.steps + 1, 40)]
    src.write_text("\n".join(lines) + "\n")
    r = _cli("watch", prereg, "--source", src)        # the registered metric is not there
    assert r.returncode == 65
    msg = r.stderr.strip().splitlines()[-1]
    assert "0 evals of 'eval_dropless/loss' judged" in msg and "eval/loss" in msg
    r = _cli("watch", prereg, "--source", src, "--metric", "eval/loss")
    assert r.returncode in (0, 1, 2) and "evals judged" in r.stderr
