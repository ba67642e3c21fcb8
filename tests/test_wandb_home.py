"""W&B as home, offline (WANDB_MODE=offline; no server is reachable): a `ladder run --wandb` rung is
grouped, named, typed and has its x axes; watching its offline directory gives the verdict its
metrics.jsonl gives; `ladder preregister --wandb` logs the forecast as its own run (keys read back
from the offline directory); `ladder watch --wandb` logs residuals and alerts into its own run;
`ladder fit wandb://...` builds the same points as the run directory."""

import json
import math
import os

import pytest
from helpers import FakeWandbApi, FakeWandbRun, offline_records

from ladder.cli.main import main
from ladder.io import read_metrics
from ladder.predict import forecast as fc
from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.predict.prereg import make_prereg
from ladder.predict.watch import config_difference
from ladder.specs import LADDERS
from ladder.wandbrun import forecast_run_id, resolve, watch_run_id

pytest.importorskip("wandb")
RUNG = LADDERS["tiny"].rungs[0]
LAW = sy.TruthLaw(sy.Truth(), run_sigma=0.005)


@pytest.fixture(scope="module")
def offline_env():
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT", "WANDB_PROJECT")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    os.environ.pop("WANDB_PROJECT", None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory, offline_env):
    """A tiny rung trained halfway by `ladder run --wandb` (~10 s: JAX compilation)."""
    out = tmp_path_factory.mktemp("wbrun")
    code = main(["run", f"tiny:{RUNG.name}", "--out", str(out), "--max-steps", "30", "--wandb",
                 "--wandb-project", "proj", "--peak_flops=1e11"])
    assert code == 0
    run_dir = out / "tiny" / RUNG.name
    return run_dir, run_dir / "wandb"


def _records(d):
    return offline_records(d)


def _prereg(tmp_path, **kw):
    doc = make_prereg(LAW, fc.Target.from_rung(RUNG), eval_noise=0.01, **kw)
    path = tmp_path / "prereg.json"
    pr.write_once(path, doc)
    return path, doc


def _watch_json(capsys, *argv):
    capsys.readouterr()
    code = main(["watch", *map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow  # ~40 s for the four: a real (tiny) training run, W&B runs
def test_train_run_is_grouped_named_typed_with_x_axes(wandb_run):
    run_dir, wdir = wandb_run
    recs = _records(wdir)
    run = next(r for r in recs if r["type"] == "run")["run"]
    assert run["run_group"] == "tiny" and run["display_name"] == RUNG.name
    assert run["job_type"] == "train" and run["project"] == "proj"
    assert set(run["tags"]) >= {"train", "ladder:tiny", f"rung:{RUNG.name}"}
    defined = {r["metric"].get("name") for r in recs if r["type"] == "metric"}
    assert {"step", "tokens", "flops"} <= defined
    rows = [r["history"]["item"] for r in recs if r["type"] == "history"]
    assert all("tokens" in r and "flops" in r and "step" in r for r in rows)
    # what the run is, in its config and its summary: names, parameter counts, tokens, compute
    want = {"ladder": "tiny", "rung_name": RUNG.name, "params": RUNG.params.total,
            "active_params": RUNG.params.active, "tokens_planned": RUNG.tokens,
            "compute": RUNG.compute(lm_head=False)}
    for kind in ("config", "summary"):
        got = {}
        for r in recs:  # the init config rides in the run record, later updates on their own
            part = r["run"].get("config") if r["type"] == "run" and kind == "config" else \
                r.get(kind) if r["type"] == kind else None
            if part:
                for item in part.get("update") or []:
                    key = item.get("key") or "/".join(item.get("nested_key") or [])
                    got[key] = json.loads(item["value_json"])
        assert {k: got.get(k) for k in want} == pytest.approx(want), kind


@pytest.mark.slow
def test_watching_the_offline_dir_gives_the_metrics_jsonl_verdict(wandb_run, tmp_path, capsys):
    run_dir, wdir = wandb_run
    prereg, _ = _prereg(tmp_path, run_config=RUNG.to_dict())
    a_code, a = _watch_json(capsys, prereg, "--source", run_dir / "metrics.jsonl")
    b_code, b = _watch_json(capsys, prereg, "--source", wdir)
    assert b_code == a_code != 3 and b["not_applicable"] is None  # W&B's 1 for 1.0 is fine
    assert (b["points"], b["evals"], b["last_step"]) == (a["points"], a["evals"], a["last_step"])
    key = [(x["kind"], x["severity"], x["step"], x["message"]) for x in a["alerts"]]
    assert [(x["kind"], x["severity"], x["step"], x["message"]) for x in b["alerts"]] == key


@pytest.mark.slow
def test_config_identity_compares_values_and_names_the_first_key(wandb_run, tmp_path, capsys):
    assert config_difference({"a": 1.0, "b": {"c": [1, 2.0]}}, {"a": 1, "b": {"c": [1.0, 2]}}) \
        is None
    assert config_difference({"a": True}, {"a": 1}) == "a (1 in the run, True registered)"
    assert config_difference({"m": {"x": 1, "y": 2}}, {"m": {"x": 1, "y": 3}}) \
        == "m.y (3 in the run, 2 registered)"
    _, wdir = wandb_run
    other = RUNG.to_dict()
    other["model"] = dict(other["model"], d_model=other["model"]["d_model"] * 2)
    prereg, _ = _prereg(tmp_path, run_config=other)
    code, v = _watch_json(capsys, prereg, "--source", wdir)
    assert code == 3
    assert "rung.model.d_model" in v["not_applicable"]
    assert f"({RUNG.model.d_model} in the run, {2 * RUNG.model.d_model} registered)" \
        in v["not_applicable"]


@pytest.mark.slow
def test_preregister_wandb_logs_the_forecast_run_and_watch_adds_to_it(wandb_run, tmp_path,
                                                                     capsys):
    run_dir, wdir = wandb_run
    pts = sy.points_table([sy.make_run(sy.Truth(), t, seed=i)
                           for i, t in enumerate(sy.ladder_targets(5, steps0=60))])
    pts.to_csv(tmp_path / "pts.csv", index=False)
    law = tmp_path / "law.json"
    assert main(["fit", str(tmp_path / "pts.csv"), "--form", "compute", "--bootstrap", "20",
                 "--out", str(law)]) == 0
    prereg = tmp_path / "prereg.json"
    assert main(["preregister", str(law), "--target", f"tiny:{RUNG.name}", "--wandb",
                 "--wandb-project", "proj", "--out", str(prereg)]) == 0
    doc = pr.load(prereg)
    fdir = next((tmp_path / "wandb").glob(f"offline-run-*-{forecast_run_id(doc['sha256'])}"))
    recs = _records(fdir)
    run = next(r for r in recs if r["type"] == "run")["run"]
    assert (run["job_type"], run["run_group"], run["project"]) == ("forecast", "tiny", "proj")
    rows = [r["history"]["item"] for r in recs if r["type"] == "history"]
    steps = sorted({int(p["step"]) for p in doc["forecast"]})
    assert [r["step"] for r in rows] == steps
    want: dict = {}  # a short target repeats steps on the 1% grid: its first point is logged
    for p in sorted(doc["forecast"], key=lambda p: p["fraction"]):
        want.setdefault(int(p["step"]), p)
    for r in rows:
        p = want[r["step"]]
        assert r["tokens"] == pytest.approx(p["tokens"])
        for k in ("loss", "lo", "hi"):  # a band the law could not compute is left out
            if isinstance(p[k], float) and math.isfinite(p[k]):
                assert r[f"forecast/{k}"] == pytest.approx(p[k]), (r["step"], k)
            else:
                assert f"forecast/{k}" not in r
    assert sum("forecast/lo" in r for r in rows) > len(rows) // 2
    art = [r for r in recs if r["type"] == "artifact" and r["artifact"]["type"] == "prereg"]
    assert art and doc["sha256"] in json.dumps(art[0])

    code, verdict = _watch_json(capsys, prereg, "--source", wdir)
    assert main(["watch", str(prereg), "--source", str(wdir), "--wandb",
                 "--wandb-project", "proj"]) == code
    # the watcher logs into its own run (job type watch), not into the forecast run
    wdirs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{watch_run_id(doc['sha256'])}*"))
    assert len(wdirs) == 1
    assert len(list((tmp_path / "wandb").glob(
        f"offline-run-*-{forecast_run_id(doc['sha256'])}*"))) == 1
    items = [r["history"]["item"] for d in wdirs for r in _records(d) if r["type"] == "history"]
    judged = [r for r in items if "watch/residual" in r]
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval_dropless/loss" in r]
    assert [r["step"] for r in judged] == [r["step"] for r in evals]
    for r, e in zip(judged, evals):
        assert r["watch/loss"] == pytest.approx(e["eval_dropless/loss"])
        assert r["watch/residual"] == pytest.approx(r["watch/loss"] - r["watch/expected"])
    # the alerts table, logged with the alerts it holds (wandb 0.31 writes its fields under
    # nested keys watch/alerts/...): there when the watch raised any, absent when it raised none
    table = any(k == "watch/alerts" or k.startswith(("watch/alerts.", "watch/alerts/"))
                for r in items for k in r)
    assert table == bool(verdict["alerts"]), verdict["alerts"]


def test_entity_and_project_honour_the_environment(monkeypatch):
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert resolve(None, None) == (None, "ladder")
    monkeypatch.setenv("WANDB_ENTITY", "marin")
    monkeypatch.setenv("WANDB_PROJECT", "hero")
    assert resolve(None, None) == ("marin", "hero")
    assert resolve("me", "mine") == ("me", "mine")


def test_fit_points_from_wandb_histories_match_the_run_directory(tmp_path):
    from ladder.fit.points import load_points
    run_dir = tmp_path / "runs" / "tiny" / RUNG.name
    run_dir.mkdir(parents=True)
    cfg = {"schema": "run-config/1", "rung": RUNG.to_dict()}
    (run_dir / "config.json").write_text(json.dumps(cfg))
    rows = sy.make_run(sy.Truth(), fc.Target.from_rung(RUNG), seed=3).rows
    for r in rows:  # as the trainer logs them (the one FLOP counter)
        r["flops"] = RUNG.compute(r["tokens"])
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = [dict(r, _step=r["step"]) for r in rows]  # W&B's history adds _step
    api = FakeWandbApi({"a1": FakeWandbRun(rows, cfg, RUNG.name),
                        "b2": FakeWandbRun(rows, {"lr": 1}, "foreign")})
    want = load_points([str(run_dir)])
    got = load_points(["wandb://ent/proj/a1"], wandb_api=api)
    cols = ["run", "params", "active_params", "tokens", "compute", "fraction", "loss", "step"]
    assert got[cols].reset_index(drop=True).equals(want[cols].reset_index(drop=True))
    # a run without a rung in its config: sizes from --sizes, FLOPs as logged
    from ladder.io import InputError
    with pytest.raises(InputError, match="--sizes"):
        load_points(["wandb://ent/proj/b2"], wandb_api=api)
    sizes = tmp_path / "sizes.csv"
    sizes.write_text(f"run,params,active_params\nforeign,{RUNG.params.total},"
                     f"{RUNG.params.active}\n")
    got2 = load_points(["wandb://ent/proj/b2"], wandb_api=api, sizes=sizes)
    assert list(got2["compute"]) == [r["flops"] for r in rows if "eval_dropless/loss" in r]
    assert list(got2["loss"]) == list(want["loss"])
    assert set(got2["params"]) == {float(RUNG.params.total)}


@pytest.mark.slow
def test_fit_points_from_an_offline_wandb_dir_match_the_run_directory(wandb_run):
    import numpy as np

    from ladder.fit.points import load_points, offline_run_points
    from ladder.sources import is_wandb_offline_dir
    run_dir, wdir = wandb_run
    assert is_wandb_offline_dir(wdir) and not is_wandb_offline_dir(run_dir)
    want = load_points([str(run_dir)])
    got = load_points([offline_run_points(str(wdir), None, None)])
    assert list(got["run"]) == list(want["run"]) == [f"tiny/{RUNG.name}"] * len(want)
    for c in ("params", "active_params", "tokens", "compute", "fraction", "loss", "step"):
        assert np.allclose(got[c].to_numpy(float), want[c].to_numpy(float), rtol=1e-12), c
    assert set(got["source"]) == {str(wdir)}
