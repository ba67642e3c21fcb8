"""Forecast calibration against a known truth, and `ladder preregister` with a law fitted by fit."""

import json
import warnings

import numpy as np
import pytest

from bench.band_calibration import leave_one_rung_out
from ladder.cli.main import main
from ladder.io import atomic_write_json, read_json
from ladder.predict import forecast as fc
from ladder.predict import prereg as pr
from tests import synthetic as sy

TRUTH = sy.Truth()
NOISE = sy.RunNoise(run_sigma=0.005, eval_sigma=0.004)


def test_band_of_the_true_law_covers_fresh_runs_at_its_level():
    """With the true law, the band (run-to-run + eval noise) must hold ~90% of fresh runs' evals.
    Known truth: each point's error is a run-level offset (log sd 0.5%, ~0.011 in loss) plus an
    eval error (sd 0.01); 100 runs x 100 evals. Without the eval term the band would hold
    P(|Z| < 1.645 x 0.011 / 0.015) ~ 79%."""
    target = sy.ladder_targets(3, steps0=50)[-1]
    law = sy.TruthLaw(TRUTH, run_sigma=NOISE.run_sigma)
    noise = sy.RunNoise(run_sigma=0.005, eval_sigma=0.01)
    pts = sy.points_table([sy.make_run(TRUTH, target, noise=noise, seed=s) for s in range(100)])
    pts["run"] = "held-out"

    def fit_fn(_df):
        return law
    pts_train = pts.assign(run="other")
    cal = leave_one_rung_out(pd_concat(pts, pts_train), fit_fn, level=0.9,
                                eval_noise=noise.eval_sigma, runs=["held-out"])
    assert cal.n == len(pts)
    assert 0.86 <= cal.coverage <= 0.94
    # without the eval noise the band is too narrow: coverage drops measurably
    narrow = leave_one_rung_out(pd_concat(pts, pts_train), fit_fn, level=0.9, eval_noise=0.0,
                                   runs=["held-out"])
    assert narrow.coverage < cal.coverage - 0.05


def pd_concat(*dfs):
    import pandas as pd
    return pd.concat(dfs, ignore_index=True)


@pytest.fixture(scope="module")
def fitted_law(tmp_path_factory):
    from ladder.fit import fit_law
    rungs = sy.ladder_targets(6, ratio=2.5, steps0=60)
    runs = [sy.make_run(TRUTH, t, noise=NOISE, seed=i) for i, t in enumerate(rungs)]
    pts = sy.points_table(runs)
    pts = pts[np.rint(pts["fraction"] * 100).astype(int) % 10 == 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit_law(pts, form="trajectory", bootstrap=20, metric="eval_dropless/loss",
                      backtest=False)
    d = tmp_path_factory.mktemp("law")
    atomic_write_json(d / "law.json", res.to_json())
    rundir = d / "runs"
    for r in runs:
        (rundir / r.target.name).mkdir(parents=True)
        with open(rundir / r.target.name / "metrics.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in r.rows)
    return d / "law.json", rundir


def test_cli_preregister_verify_watch_with_a_fitted_law(fitted_law, tmp_path, capsys):
    law_path, rundir = fitted_law
    target = sy.ladder_targets(7, ratio=2.5, steps0=60)[-1]
    spec = tmp_path / "target.json"
    spec.write_text(json.dumps(target.to_dict()))
    out = tmp_path / "prereg.json"
    code = main(["preregister", str(law_path), "--target-spec", str(spec), "--runs", str(rundir),
                 "--data-tag", "mix-a", "--require", "train.z_loss=0.0001", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    doc = read_json(out)
    assert doc["law"]["form"] == "trajectory" and doc["metric"] == "eval_dropless/loss"
    assert doc["eval_noise"]["sigma"] == pytest.approx(NOISE.eval_sigma, rel=0.25)
    assert doc["health_reference"]["signals"]["moe/drop_frac"]["median"][50] == \
        pytest.approx(NOISE.drop_frac, rel=0.2)
    lo = np.array([p["lo"] for p in doc["forecast"]])
    hi = np.array([p["hi"] for p in doc["forecast"]])
    loss = np.array([p["loss"] for p in doc["forecast"]])
    assert np.all(lo < loss) and np.all(loss < hi)
    # the forecast is of the truth within its band at the end (known law)
    true_final = float(TRUTH.loss(target.compute, 1.0))
    assert doc["final"]["lo"] < true_final < doc["final"]["hi"]
    assert main(["verify", str(out)]) == 0
    # the same target again: refused, the file is untouched
    before = out.read_bytes()
    assert main(["preregister", str(law_path), "--target-spec", str(spec), "--out",
                 str(out)]) == 73
    assert out.read_bytes() == before
    # amend: a new file linked to the old one by hash
    v2 = tmp_path / "prereg-v2.json"
    assert main(["preregister", str(law_path), "--target-spec", str(spec), "--amend", str(out),
                 "--reason", "data mix changed", "--data-tag", "mix-b", "--out", str(v2)]) == 0
    assert read_json(v2)["amends"]["sha256"] == doc["sha256"]
    capsys.readouterr()
    assert main(["verify", str(v2)]) == 0
    assert "data mix changed" in capsys.readouterr().out
    # the watcher given the old file follows the amendment and says so
    m = tmp_path / "live"
    m.mkdir()
    rows = sy.make_run(TRUTH, target, noise=NOISE, seed=99, offset=0.0).rows
    with open(m / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    (m / "config.json").write_text(json.dumps({"schema": "run-config/1",
                                               "train": {"data_tag": "mix-b", "z_loss": 1e-4}}))
    capsys.readouterr()
    code = main(["watch", str(out), "--source", str(m)])
    err = capsys.readouterr().err
    assert "prereg-v2.json" in err and "amendment 1" in err
    assert code == 0
    # the unamended forecast, on its own, no longer applies (data tag): exit 3, not a false alarm
    from ladder.predict.live import Watcher
    from ladder.sources import JsonlSource
    w = Watcher(pr.load(out), JsonlSource(m / "metrics.jsonl"), [], None)
    w.poll()
    assert w.exit_code == 3


def test_target_spec_errors_name_the_field(tmp_path):
    from ladder.io import InputError
    with pytest.raises(InputError, match="steps"):
        fc.Target.from_spec({"params": 1, "active_params": 1, "tokens": 1, "compute": 1,
                             "seq_len": 4}, path="t.json")
    with pytest.raises(InputError, match="compute"):
        fc.Target.from_spec({"params": 1, "active_params": 1, "tokens": 1, "compute": -1,
                             "steps": 3, "seq_len": 4}, path="t.json")
