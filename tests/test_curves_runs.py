"""Curve laws on ladder run directories: exact LRs from config.json, fit across rung sizes with
fit.load_points, and the forecast of a target under a re-aimed (shortened) decay."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest
from helpers import predict_rung, schedules_from_sources
from test_curves_laws import mpl_reference  # tests/ is on sys.path under pytest

from ladder.fit import load_points
from ladder.fit.curve_fit import fit_curve_law
from ladder.fit.lr_schedules import lr_from_schedule
from ladder.specs import get_ladder

SHAPE = {"alpha": 0.45, "B": 0.9, "C": 0.02, "beta": 0.6, "gamma": 0.5}
UNIT = 0.01   # LR unit of the synthetic truth (the fit picks its own; the family is the same)


def truth(active: float) -> dict:
    r = active / 1e4
    return dict(SHAPE, L0=3.0 * r ** -0.05, A=1.5 * r ** -0.1, unit=UNIT)


def write_run(root, rung, train=None):
    d = root / rung.ladder / rung.name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"schema": "run-config/1", "rung": rung.to_dict(),
                                               "train": train or {}, "mesh": {}}))
    lr = rung.peak_lr * np.array([rung.schedule.lr_frac(i, rung.steps)
                                  for i in range(rung.steps)])
    steps = np.arange(2, rung.steps + 1, 2)
    y = mpl_reference(lr, steps, truth(rung.params.active))
    with open(d / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps({"step": int(s), "tokens": int(s) * rung.tokens_per_step,
                                "progress": s / rung.steps, "time": 0.0,
                                "eval_dropless/loss": float(v),
                                "optim/lr": float(lr[s - 1])}) + "\n" for s, v in zip(steps, y))
    return lr


def test_schedules_from_config_are_the_trainers(tmp_path):
    lad = get_ladder("tiny")
    lr = write_run(tmp_path, lad.rungs[0])
    spiked = lad.rungs[1]
    write_run(tmp_path, spiked, train={"fault": "lr-spike", "fault_at": 0.5, "fault_scale": 4.0})
    got = schedules_from_sources([tmp_path, tmp_path / "missing.csv"])
    assert set(got) == {f"tiny/{lad.rungs[0].name}", f"tiny/{spiked.name}"}
    np.testing.assert_allclose(got[f"tiny/{lad.rungs[0].name}"], lr, rtol=1e-15)
    plain = lr_from_schedule(spiked.schedule, spiked.steps, spiked.peak_lr)
    at = round(0.5 * spiked.steps)
    np.testing.assert_allclose(got[f"tiny/{spiked.name}"][:at], plain[:at])
    np.testing.assert_allclose(got[f"tiny/{spiked.name}"][at:], 4.0 * plain[at:])


@pytest.mark.heavy  # 11 s on 2 busy cores
def test_ladder_runs_forecast_the_target_under_a_shortened_decay(tmp_path):
    lad = get_ladder("tiny")
    for rung in lad.rungs:
        write_run(tmp_path, rung)
    df = load_points([str(tmp_path)], "eval_dropless/loss")
    law = fit_curve_law(df, "mpl", bootstrap=0, n_starts=2,
                        schedules=schedules_from_sources([tmp_path]))
    assert law.size_variable == "active_params" and law.scaled == ("L0", "A")
    target = lad.target
    short = dataclasses.replace(target.schedule, decay_end=0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = predict_rung(law, target, short)
    lr = lr_from_schedule(short, target.steps, target.peak_lr)
    want = mpl_reference(lr, pred.step, truth(target.params.active))
    # 3 rungs, one schedule shape each, target 3x the largest rung and 3x its steps
    assert np.max(np.abs(pred.loss / want - 1)) < 0.01
    assert pred.loss[-1] == pytest.approx(want[-1], rel=5e-3)


def test_contingency_forecast_planned_vs_shortened():
    from test_curves_laws import MPL_TRUE

    from ladder.fit.curve_law import CurveLaw
    from helpers import contingency_forecast

    rung = get_ladder("tiny").target
    law = CurveLaw(form="mpl", params=dict(MPL_TRUE), lr_scale=UNIT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = contingency_forecast(law, rung, 0.6)
    assert c.planned.steps == rung.steps and c.shortened.steps == round(0.6 * rung.steps)
    assert c.shortened.tokens == c.shortened.steps * rung.tokens_per_step
    for plan, end in ((c.planned, 1.0), (c.shortened, 0.6)):
        sched = dataclasses.replace(rung.schedule, decay_end=end)
        lr = lr_from_schedule(sched, rung.steps, rung.peak_lr)
        want = mpl_reference(lr, [plan.steps], dict(MPL_TRUE, unit=UNIT))[0]
        assert plan.loss == pytest.approx(want, rel=1e-4)
    assert c.shortened.loss > c.planned.loss          # fewer tokens: a higher final loss
    assert np.isnan(c.planned.lo)                      # no bootstrap draws: no band
