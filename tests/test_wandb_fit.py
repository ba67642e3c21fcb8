"""W&B runs are fitted like run folders (issue 38 item 2): the ladder's target rung, which `ladder
run` trains beside the rungs, is the run the law forecasts, so `ladder fit` leaves it out of W&B
runs as it does of run folders (``--include-target`` keeps it), and one ladder fitted both ways
gives the same law."""

import json

import numpy as np
import pytest
from helpers import FakeWandbApi, FakeWandbRun, write_law_runs

from ladder.cli.main import main
from ladder.fit.law import fit_law
from ladder.fit.points import load_points

COLS = ["run", "params", "active_params", "tokens", "compute", "fraction", "loss", "step"]


def _ladder(tmp_path):
    """The tiny ladder's runs, its target's too, as folders and as W&B histories (ids r0..)."""
    lad = write_law_runs(tmp_path / "runs", target=True)
    runs = {}
    for i, rung in enumerate(lad.all):
        d = tmp_path / "runs" / lad.name / rung.name
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        runs[f"r{i}"] = FakeWandbRun([dict(r, _step=r["step"]) for r in rows],
                             json.loads((d / "config.json").read_text()), rung.name)
    return lad, runs


def test_wandb_runs_leave_the_target_out_and_give_the_folders_law(tmp_path):
    lad, runs = _ladder(tmp_path)
    uri = "wandb://ent/proj/" + ",".join(runs)
    folders = load_points([str(tmp_path / "runs")])
    wb = load_points([uri], wandb_api=FakeWandbApi(runs))
    target = f"{lad.name}/{lad.target.name}"
    assert folders.attrs["left_out"] == wb.attrs["left_out"] == [target]
    assert target not in set(wb["run"]) and len(set(wb["run"])) == len(lad.rungs)
    a = folders[COLS].sort_values(["run", "step"]).reset_index(drop=True)
    b = wb[COLS].sort_values(["run", "step"]).reset_index(drop=True)
    assert a.equals(b)
    law_a, law_b = fit_law(folders, form="compute"), fit_law(wb, form="compute")
    assert law_a.params == pytest.approx(law_b.params, rel=1e-9)
    # asked for, the target's run is a point like any other
    every = load_points([uri], wandb_api=FakeWandbApi(runs), include_target=True)
    assert target in set(every["run"]) and every.attrs["left_out"] == []


def test_a_wandb_target_alone_is_refused_with_the_flag_to_keep_it(tmp_path):
    from ladder.io import InputError
    lad, runs = _ladder(tmp_path)
    last = f"r{len(lad.all) - 1}"
    with pytest.raises(InputError, match="--include-target"):
        load_points([f"wandb://ent/proj/{last}"], wandb_api=FakeWandbApi(runs))


@pytest.mark.slow  # four offline W&B runs (~15 s)
def test_ladder_fit_on_offline_wandb_runs_gives_the_folders_law(tmp_path, monkeypatch):
    """`ladder fit` on W&B offline run directories (one per rung and the target, written by
    wandb itself) and on the run folders: the same points (the target left out) and law."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    lad, runs = _ladder(tmp_path)
    dirs = []
    for rid, r in runs.items():
        run = wandb.init(project="proj", group=lad.name, name=r.name, id=rid, job_type="train",
                         dir=str(tmp_path / rid), config=r.config, reinit="finish_previous")
        for row in r.rows:
            run.log({k: v for k, v in row.items() if k != "_step"}, step=row["_step"])
        run.finish()
        dirs.append(str(next((tmp_path / rid / "wandb").glob("offline-run-*"))))
    out_a, out_b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["fit", str(tmp_path / "runs"), "--form", "compute", "--out", str(out_a),
                 "-q"]) == 0
    assert main(["fit", *dirs, "--form", "compute", "--out", str(out_b), "-q"]) == 0
    a, b = json.loads(out_a.read_text()), json.loads(out_b.read_text())

    def fitted_runs(doc):
        cols = doc["points"]["columns"]
        return sorted(r[cols.index("run")] for r in doc["points"]["rows"])
    assert fitted_runs(b) == fitted_runs(a)  # the same points of the same runs
    assert f"{lad.name}/{lad.target.name}" not in fitted_runs(b)
    assert b["params"] == pytest.approx(a["params"], rel=1e-9)
    assert np.isfinite(list(a["params"].values())).all()


def test_a_bad_wandb_uri_or_run_is_one_line_naming_it_and_the_argument():
    """`ladder fit`'s W&B URIs are read by ladder.sources (the watcher's reader): its errors
    name the URI (the run's, when one run is not readable) and fit's argument, SOURCE."""
    from ladder.io import InputError
    with pytest.raises(InputError) as e:
        load_points(["wandb://ent/proj"], wandb_api=FakeWandbApi({}))
    assert (e.value.field, e.value.exit_code) == ("SOURCE", 64)
    assert "wandb://ENTITY/PROJECT/RUN_ID" in str(e.value) and "'wandb://ent/proj'" in str(e.value)
    with pytest.raises(InputError) as e:
        api = FakeWandbApi({"a": FakeWandbRun([], {}, "a")})
        load_points(["wandb://ent/proj/a, zz"], wandb_api=api)
    assert (e.value.path, e.value.field, e.value.exit_code) == ("wandb://ent/proj/zz", "SOURCE",
                                                                 69)
    assert "W&B run not readable (KeyError" in str(e.value)
