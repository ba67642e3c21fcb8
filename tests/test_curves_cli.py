"""Schedule parsing and sampling (fit.lr_schedules) and `ladder predict law.json --schedule`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ladder.cli.main import main
from ladder.fit.curve_law import CurveLaw
from ladder.fit.lr_schedules import lr_from_samples, parse_schedule, read_schedule_csv
from ladder.io import InputError

MPL = {"L0": 2.5, "A": 1.6, "alpha": 0.45, "B": 0.9, "C": 0.02, "beta": 0.6, "gamma": 0.5}


def test_named_linear_schedule_by_hand():
    ns = parse_schedule("linear:steps=100,peak=1e-3,warmup=0.1,min=0.1")
    lr = ns.lr()
    assert lr.shape == (100,)
    # warmup 10 updates: update s has (s)/10 of peak; then linear from peak to 10% at the end
    assert lr[0] == pytest.approx(1e-4)
    assert lr[9] == pytest.approx(1e-3)
    assert lr[10] == pytest.approx(1e-3)                       # i=10: t=0
    assert lr[99] == pytest.approx(1e-3 * (1 - 0.9 * 89 / 90))  # i=99: t=89/90


def test_decay_end_reaims_the_decay():
    lr = parse_schedule("linear:steps=100,peak=2e-3,warmup=0,min=0.05,decay_end=0.6").lr()
    assert lr[0] == pytest.approx(2e-3)
    assert lr[59] == pytest.approx(2e-3 * (1 - 0.95 * 59 / 60))
    assert np.allclose(lr[60:], 2e-3 * 0.05)                   # after decay_end: the floor


def test_wsd_and_cosine_and_constant():
    wsd = parse_schedule("wsd:steps=100,peak=1,warmup=0,decay=0.2,min=0").lr()
    assert np.all(wsd[:80] == 1.0) and wsd[90] == pytest.approx(0.5)
    cos = parse_schedule("cosine:steps=100,peak=1,warmup=0,min=0").lr()   # t = i / 100
    assert cos[50] == pytest.approx(0.5) and cos[0] == pytest.approx(1.0)
    assert np.all(parse_schedule("constant:steps=10,peak=3e-4,warmup=0").lr() == 3e-4)


@pytest.mark.parametrize("text, msg", [
    ("triangle:steps=10,peak=1", "kind"),
    ("linear:peak=1e-3", "steps"),
    ("linear:steps=10", "peak"),
    ("linear:steps=10,peak=1e-3,foo=1", "bad schedule item"),
    ("linear:steps=10,peak=1e-3,peak=2e-3", "twice"),
    ("linear:steps=ten,peak=1e-3", "not a number"),
    ("linear:steps=10.5,peak=1e-3", "integer"),
    ("linear:steps=10,peak=1e-3,decay_end=1.5", "decay_end"),
    ("linear:steps=10,peak=-1", "peak"),
])
def test_bad_named_schedules(text, msg):
    with pytest.raises(InputError, match=msg):
        parse_schedule(text)


def test_sampled_lr_interpolation_by_hand():
    # samples at steps 10, 20, 30 with 1.0, 1.0, 0.5: warmup from 0 at step 0, then linear
    lr = lr_from_samples([10, 20, 30], [1.0, 1.0, 0.5])
    assert lr.shape == (30,)
    assert lr[4] == pytest.approx(0.5)             # update 5: half way up the warmup
    assert lr[14] == pytest.approx(1.0)
    assert lr[24] == pytest.approx(0.75)
    longer = lr_from_samples([1, 3], [2.0, 4.0], until=5)
    assert longer.tolist() == [2.0, 3.0, 4.0, 4.0, 4.0]  # step 1 sampled: no warmup assumption
    with pytest.raises(InputError, match="repeated"):
        lr_from_samples([1, 1], [1.0, 2.0])
    with pytest.raises(InputError):
        lr_from_samples([0, 1], [1.0, 2.0])


def test_schedule_csv_errors(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("step,rate\n1,0.1\n")
    with pytest.raises(InputError) as e:
        read_schedule_csv(p)
    assert e.value.field == "lr" and str(p) in str(e.value)
    p.write_text("step,lr\n1,abc\n")
    with pytest.raises(InputError, match="lr"):
        read_schedule_csv(p)


def _law_file(tmp_path, draws=True, scaled=False):
    law = CurveLaw(form="mpl", params=dict(MPL), lr_scale=1e-3, sigma=0.01 if draws else
                   float("nan"), level=0.9)
    if draws:
        # parameter draws around the estimate (as a bootstrap would give)
        law.draws = [dict(MPL, L0=MPL["L0"] * f) for f in (0.99, 0.995, 1.0, 1.005, 1.01)]
    if scaled:
        law.params.update(L0_size_exp=-0.05, A_size_exp=-0.1)
        law.scaled, law.size_variable, law.size_ref = ("L0", "A"), "active_params", 1e7
        law.draws = [dict(d, L0_size_exp=-0.05, A_size_exp=-0.1) for d in law.draws]
    path = tmp_path / "law.json"
    path.write_text(json.dumps(law.to_json()))
    return path


def _rows(out: str):
    lines = out.strip().splitlines()
    assert lines[0] == "step,loss,lo,hi"
    return np.array([[float(x) for x in ln.split(",")] for ln in lines[1:]])


def test_cli_named_schedule_prints_csv(tmp_path, capsys):
    law = _law_file(tmp_path)
    rc = main(["predict", str(law), "--schedule", ("linear:steps=400,peak=1e-3,warmup=0.01,"
               "min=0.05,decay_end=0.6")])
    assert rc == 0
    rows = _rows(capsys.readouterr().out)
    assert rows.shape == (100, 4)                           # every 1% of the run
    assert rows[0, 0] == 4 and rows[-1, 0] == 400
    assert np.all(np.diff(rows[:, 0]) > 0)
    assert np.all(rows[:, 2] < rows[:, 1]) and np.all(rows[:, 1] < rows[:, 3])
    # the law's value at the end, by hand: the constant part of the curve is exact
    assert np.all(np.isfinite(rows))


def test_cli_csv_schedule_reports_its_steps(tmp_path, capsys):
    law = _law_file(tmp_path)
    sched = tmp_path / "sched.csv"
    sched.write_text("step,lr\n10,1e-3\n50,1e-3\n100,5e-4\n150,1e-4\n")
    assert main(["predict", str(law), "--schedule", str(sched)]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows[:, 0].tolist() == [10, 50, 100, 150]
    # at step 50 no LR has dropped yet: L0 + A * S^-alpha, S = 5.5 (warmup 1..10) + 40 (x 1e-3)
    assert rows[1, 1] == pytest.approx(MPL["L0"] + MPL["A"] * 45.5 ** -MPL["alpha"], rel=1e-7)


def test_cli_errors(tmp_path, capsys):
    law = _law_file(tmp_path, scaled=True)
    # a size-scaled law needs the target size
    assert main(["predict", str(law), "--schedule", "cosine:steps=50,peak=1e-3"]) >= 64
    assert "active-params" in capsys.readouterr().err
    assert main(["predict", str(law), "--schedule", "cosine:steps=50,peak=1e-3",
                 "--active-params", "2e7"]) == 0
    capsys.readouterr()
    assert main(["predict", str(law), "--schedule", "bogus:steps=5"]) >= 64
    assert main(["predict", str(law), "--schedule", "cosine:steps=50,peak=1e-3",
                 "--active-params", "2e7", "--tokens", "1e9"]) >= 64
    assert main(["predict", str(tmp_path / "missing.json"), "--schedule",
                 "cosine:steps=5,peak=1"]) >= 64


def test_cli_without_draws_warns_and_prints_nan(tmp_path, capsys):
    law = _law_file(tmp_path, draws=False)
    assert main(["predict", str(law), "--schedule", "constant:steps=20,peak=1e-3"]) == 0
    captured = capsys.readouterr()
    rows = _rows(captured.out)
    assert np.all(np.isnan(rows[:, 2])) and "band" in captured.err


def test_cli_schedule_with_a_law_that_is_not_a_curve_law_names_the_form(capsys):
    # the one reader (fit.result.LawResult.from_json) reads the file; --schedule then asks for
    # a curve law: a compute law written by main is refused with one line, exit 65
    from pathlib import Path
    law = Path(__file__).parent / "data" / "law_main_72fc951_compute.json"
    assert main(["predict", str(law), "--schedule", "cosine:steps=50,peak=1e-3"]) == 65
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'form'" in err and "compute law" in err
