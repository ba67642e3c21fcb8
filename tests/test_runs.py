"""The run-directory reader (sources/runs.py) and the LR table (lrtable.py): one discovery
and status rule, and fit, predict and reports seeing the same runs through it."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from ladder.io import InputError
from ladder.lrtable import lr_table, run_lr_table
from ladder.sources.runs import ended_status, find_run_dirs, read_run, read_runs
from ladder.specs import Schedule, get_ladder

LAD = get_ladder("tiny")
METRIC = "eval_dropless/loss"


def write_run(root, rung, *, status=None, rows=4, train=None, target=False):
    d = root / rung.ladder / rung.name
    d.mkdir(parents=True)
    spec = dict(rung.to_dict(), is_target=target)
    (d / "config.json").write_text(json.dumps({"schema": "run-config/1", "rung": spec,
                                               "train": train or {}}))
    if status is not None:
        (d / "summary.json").write_text(json.dumps({"schema": "run-summary/1", "status": status,
                                                    "ladder": rung.ladder, "rung": rung.name}))
    with open(d / "metrics.jsonl", "w") as f:
        for i in range(1, rows + 1):
            s = i * rung.steps // rows
            f.write(json.dumps({"step": s, "tokens": s * rung.tokens_per_step,
                                "progress": s / rung.steps, METRIC: 3.0 - 0.1 * i}) + "\n")
    return d


def test_discovery_stops_at_runs_checkpoints_hidden_and_depth(tmp_path):
    a = tmp_path / "lad" / "a"
    b = tmp_path / "lad" / "b"
    deep = tmp_path / "1" / "2" / "3" / "4"
    for d in (a / "checkpoints" / "7", b, tmp_path / ".trash" / "r", deep):
        d.mkdir(parents=True)
    (a / "metrics.jsonl").write_text("")
    (a / "checkpoints" / "7" / "metrics.jsonl").write_text("")  # inside a run: not a run
    (b / "summary.json").write_text('{"schema": "run-summary/1", "status": "failed"}')
    (tmp_path / ".trash" / "r" / "metrics.jsonl").write_text("")
    (deep / "metrics.jsonl").write_text("")  # four levels down
    assert find_run_dirs(tmp_path) == [a, b]
    assert find_run_dirs(a) == [a]           # a run directory itself
    runs = {r.path.name: r for r in read_runs(tmp_path)}
    assert runs["a"].status == "running" and runs["b"].status == "failed"
    assert ended_status(b) == "failed" and ended_status(a) is None


def test_identity_plan_and_status_come_from_config_and_summary(tmp_path):
    rung = LAD.rungs[0]
    d = write_run(tmp_path, rung, status="complete")
    run = read_run(d)
    assert (run.key, run.status) == (f"tiny/{rung.name}", "complete")
    assert run.params == rung.params.total and run.planned_steps() == rung.steps
    assert run.compute_at(1000.0) == rung.compute(1000.0)
    assert len(run.rows) == 4 and all(METRIC in r for r in run.rows)
    (d / "summary.json").unlink()
    assert read_run(d).status == "running"
    (d / "config.json").write_text(json.dumps({"schema": "run-config/1", "rung": {"d": 1}}))
    with pytest.raises(InputError, match="config.json.*rung"):
        read_run(d)


def test_lr_table_is_the_schedule_times_the_peak_with_the_spike():
    const = lr_table(Schedule("constant", warmup=0.0), 10, 2e-3, spike_at=6, spike_scale=5.0)
    np.testing.assert_array_equal(const, [2e-3] * 6 + [1e-2] * 4)
    lin = lr_table(Schedule("linear", warmup=0.0, min_lr_frac=0.0, decay_end=1.0), 4, 1.0)
    np.testing.assert_allclose(lin, [1.0, 0.75, 0.5, 0.25])


def test_run_lr_table_applies_the_spike_with_the_trainers_defaults():
    from ladder.trainer.trainconfig import Fault, TrainConfig

    rung = LAD.rungs[0]
    fault = Fault("lr-spike")
    # config.json without fault_at/fault_scale (an older run) vs the trainer's full flat config
    got = run_lr_table(rung, {"fault": "lr-spike"})
    np.testing.assert_array_equal(got, run_lr_table(rung, TrainConfig(fault=fault).to_dict()))
    plain = run_lr_table(rung, TrainConfig().to_dict())
    k = fault.first_step(rung.steps)
    np.testing.assert_array_equal(got[:k], plain[:k])
    np.testing.assert_allclose(got[k:], fault.scale * plain[k:], rtol=1e-12)
    np.testing.assert_array_equal(plain, run_lr_table(rung, None))


def test_fit_predict_and_reports_see_the_same_runs(tmp_path):
    from ladder.fit import load_points
    from ladder.predict.forecast import read_ladder_runs
    from ladder.reports.inputs import load_inputs

    good = [write_run(tmp_path, r, status="complete") for r in LAD.rungs[:2]]
    write_run(tmp_path, LAD.rungs[2], status="diverged")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points = load_points([str(tmp_path)])
    assert sorted(set(points["run"])) == sorted(read_run(d).key for d in good)
    assert sorted(r.path for r in read_ladder_runs(tmp_path)) == sorted(map(str, good))
    inp = load_inputs(runs=tmp_path)
    statuses = {r.name: r.status for r in inp.rungs}
    assert statuses == {LAD.rungs[0].name: "complete", LAD.rungs[1].name: "complete",
                        LAD.rungs[2].name: "diverged"}   # the report shows the diverged run


def test_source_keys_reads_through_ladder_io(tmp_path):
    from ladder.cli.predict import source_keys

    src = tmp_path / "m.jsonl"
    src.write_text('{"step": 1, "a": 1}\n' + "[" * 100_000 + "\n" + '{"b": 2}\n{"c": ')
    assert source_keys(str(src)) == "step, a, b"    # too deep: skipped; partial last line: not
    csv = tmp_path / "m.csv"
    csv.write_text("_step, loss\r\n1,2\n")
    assert source_keys(str(csv)) == "_step, loss"
    assert source_keys(str(tmp_path)) == ""


@pytest.mark.parametrize("schema", ["run-summary/2", "run-summary/10"])
def test_the_status_reader_and_resume_refuse_a_later_run_summary(tmp_path, schema):
    """Was: ended_status and the trainer's resume read a run-summary/2 (a later ladder's) as
    version 1. Both refuse it in one line naming the file and 'schema'; version 1 still reads."""
    from ladder.trainer.rundir import previous_run
    f = tmp_path / "summary.json"
    f.write_text(json.dumps({"schema": "run-summary/1", "status": "complete"}))
    assert ended_status(tmp_path) == "complete"
    assert previous_run(tmp_path, {}, resume=True)["status"] == "complete"
    f.write_text(json.dumps({"schema": schema, "status": "complete"}))
    for read in (lambda: ended_status(tmp_path),
                 lambda: previous_run(tmp_path, {}, resume=True)):
        with pytest.raises(InputError) as e:
            read()
        assert (e.value.field, e.value.path) == ("schema", str(f))
        assert len(str(e.value).splitlines()) == 1 and schema in str(e.value)
