"""W&B's default panel shows the live curve in its band (issue 24, item 1): the forecast run logs
the watched key itself at the target's steps, the watcher logs into its own run (job type watch,
the ladder's group) at the watched run's steps, and the alerts table grows as alerts come.

The fast tests record what is handed to wandb (a stand-in module); the slow one writes real
offline W&B runs (WANDB_MODE=offline, no server) and reads them back with the project's own
record reader (ladder.sources.read_wandb_records)."""

import json
import math

import pytest

from ladder.cli.main import main
from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.predict.live import Watcher
from ladder.predict.prereg import make_prereg
from ladder.sources import JsonlSource
from ladder.predict.wandb_home import WatchRunSink, log_forecast
from ladder.wandbrun import band_keys, forecast_run_id, watch_run_id

TRUTH = sy.Truth()
TARGET = sy.ladder_targets(4, steps0=150)[-1]
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)
METRIC = "eval_dropless/loss"


class _Table:
    def __init__(self, columns=None, data=None, log_mode="IMMUTABLE"):
        self.columns, self.data, self.log_mode = columns, list(data or []), log_mode

    def add_data(self, *row):
        self.data.append(list(row))


class _Run:
    def __init__(self, kw, step=0):
        self.kw, self.logs, self.defined, self.summary, self.alerts = kw, [], {}, {}, []
        self.id, self.dir, self.step = kw.get("id"), str(kw.get("dir") or "."), step
        self.finished = False

    def define_metric(self, name, step_metric=None, summary=None):
        self.defined[name] = step_metric

    def log(self, row, step=None):
        # what W&B keeps: a snapshot of the row (a Table: the rows it holds at this log)
        self.logs.append(({k: (len(v.data) if isinstance(v, _Table) else
                               v.kw if isinstance(v, _Chart) else v)
                           for k, v in row.items()}, step))

    def alert(self, **kw):
        self.alerts.append(kw)

    def log_artifact(self, art):
        pass

    def finish(self, **kw):
        self.finished = True


class _Chart:
    def __init__(self, **kw):
        self.kw = kw


class _Plot:
    @staticmethod
    def line_series(**kw):
        return _Chart(**kw)


class _Wandb:
    """The parts of the wandb module ladder uses, recording every call."""

    Table = _Table
    plot = _Plot

    class Artifact:
        def __init__(self, **kw):
            self.kw = kw

        def add_file(self, *a, **kw):
            pass

    class AlertLevel:
        INFO, WARN, ERROR = "INFO", "WARN", "ERROR"

    def __init__(self, resumed_step=0):
        self.runs, self.resumed_step = [], resumed_step

    def init(self, **kw):
        self.runs.append(_Run(kw, self.resumed_step))
        return self.runs[-1]


@pytest.fixture
def prereg(tmp_path):
    doc = make_prereg(LAW, TARGET, eval_noise=0.003, created="2026-01-01T00:00:00Z")
    path = tmp_path / "prereg.json"
    pr.write_once(path, doc)
    return path, doc


def _rows(fault_at=0.3):
    """A run that goes 3% above its forecast from ``fault_at``, and logs a NaN train loss at
    80% (alerts in both halves)."""
    rows = sy.make_run(TRUTH, TARGET, seed=1, fault=sy.Fault("shift", fault_at, 0.03)).rows
    rows[int(0.8 * len(rows))]["train/loss"] = "NaN"
    return rows


def test_forecast_run_logs_the_watched_key_at_the_targets_steps(prereg):
    path, doc = prereg
    wb = _Wandb()
    log_forecast(doc, path, group="lad", wandb_module=wb)
    run = wb.runs[0]
    assert run.kw["job_type"] == "forecast" and run.kw["group"] == "lad"
    centre, lo, hi = band_keys(METRIC)
    assert (lo, hi) == (f"{METRIC}_lo", f"{METRIC}_hi")  # beside it: the same panel section
    assert all(run.defined[k] == "step" for k in (centre, lo, hi))  # as the train runs do
    first = {}
    for p in sorted(doc["forecast"], key=lambda p: p["fraction"]):
        first.setdefault(int(p["step"]), p)
    rows = [(r, s) for r, s in run.logs if "band" not in r]  # the chart: its own test
    assert [s for _, s in rows] == sorted(first)  # W&B's step = the target's step
    for row, s in rows:
        p = first[s]
        assert row["step"] == s
        assert row[centre] == row["forecast/loss"] == pytest.approx(p["loss"])
        if isinstance(p["lo"], float) and math.isfinite(p["lo"]):
            assert (row[lo], row[hi]) == (pytest.approx(p["lo"]), pytest.approx(p["hi"]))


def _series(chart) -> dict:
    return {k: dict(zip(x, y, strict=True))
            for k, x, y in zip(chart["keys"], chart["xs"], chart["ys"], strict=True)}


def test_forecast_run_logs_one_chart_with_the_centre_and_both_band_edges(prereg):
    path, doc = prereg
    wb = _Wandb()
    log_forecast(doc, path, group="lad", wandb_module=wb)
    charts = [r["band"] for r, _ in wb.runs[0].logs if "band" in r]
    assert len(charts) == 1 and charts[0]["xname"] == "step"
    got = _series(charts[0])
    assert set(got) == {"forecast", "band lo", "band hi"}  # no live curve before the watcher
    for p in doc["forecast"]:
        s = int(p["step"])
        if s in got["forecast"] and p["loss"] == pytest.approx(got["forecast"][s]):
            assert got["band lo"][s] < got["forecast"][s] < got["band hi"][s]
    first = {}
    for p in sorted(doc["forecast"], key=lambda p: p["fraction"]):
        first.setdefault(int(p["step"]), p)
    assert sorted(got["forecast"]) == sorted(first)
    assert all(got["forecast"][s] == pytest.approx(p["loss"]) for s, p in first.items())


def test_watch_run_logs_at_the_heros_steps_and_the_alerts_table_grows(prereg, tmp_path):
    path, doc = prereg
    rows = _rows()
    m = tmp_path / "metrics.jsonl"
    half = [r for r in rows if r["progress"] <= 0.5]
    m.write_text("".join(json.dumps(r) + "\n" for r in half))
    wb = _Wandb()
    sink = WatchRunSink(doc, group="lad", wandb_module=wb)
    w = Watcher(path, JsonlSource(m), [sink])
    sink.attach(w)
    first = w.poll()
    with open(m, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[len(half):])
    second = w.poll()
    sink.close()
    run = wb.runs[0]
    assert run.kw["job_type"] == "watch" and run.kw["group"] == "lad"
    assert run.kw["id"] == watch_run_id(doc["sha256"]) != forecast_run_id(doc["sha256"])
    assert run.defined["watch/*"] == "step"
    steps = [s for _, s in run.logs]
    assert steps == sorted(steps) and all(r["step"] == s for r, s in run.logs)
    evals = sorted(r["step"] for r in rows if METRIC in r)
    assert [s for r, s in run.logs if "watch/loss" in r] == evals  # every eval at its step
    # the alerts table is logged after each poll that raised alerts, with the rows so far
    tables = [(r["watch/alerts"], s) for r, s in run.logs if "watch/alerts" in r]
    assert len(first) > 0 and len(second) > 0
    assert [n for n, _ in tables] == [len(first), len(first) + len(second)]
    assert tables[0][1] <= max(r["step"] for r in half) < tables[1][1]
    # each stepped alert's severity at its own step
    sev = {s: r["watch/alert_severity"] for r, s in run.logs if "watch/alert_severity" in r}
    for a in first + second:
        if a.step is not None:
            assert a.step in sev
    assert run.summary["watch/alerts_n"] == len(first) + len(second) and run.finished
    # one chart: the live curve at every eval, beside the forecast centre and its band's edges
    charts = [r["band"] for r, _ in run.logs if "band" in r]
    assert charts, "the watch run logs its band chart"
    got = _series(charts[-1])
    assert set(got) == {f"{METRIC} (live)", "forecast", "band lo", "band hi"}
    live = {r["step"]: r[METRIC] for r in rows if METRIC in r}
    assert got[f"{METRIC} (live)"] == pytest.approx(live)
    assert max(got["forecast"]) >= max(live)  # the forecast spans the whole run


def test_a_resumed_watch_run_skips_what_it_logged_before(prereg, tmp_path):
    """Online, a resumed run continues at the server's step: evals up to it were logged by the
    watcher before (W&B would drop them with a warning)."""
    path, doc = prereg
    m = tmp_path / "metrics.jsonl"
    m.write_text("".join(json.dumps(r) + "\n" for r in _rows(fault_at=0.9)))
    wb = _Wandb(resumed_step=600)
    sink = WatchRunSink(doc, wandb_module=wb)
    w = Watcher(path, JsonlSource(m), [sink])
    sink.attach(w)
    w.poll()
    sink.close()
    logged = [s for r, s in wb.runs[0].logs if "watch/loss" in r]
    assert logged and min(logged) > 600


def test_a_restarted_watcher_whose_wandb_source_starts_over_logs_each_row_once(prereg,
                                                                               tmp_path):
    """The hero crashed at 50% and goes on as a new W&B run: the restarted watcher (--state) is
    given the lineage ``a1,b2``, which its saved read position (of ``a1``) does not fit, so the
    source reads the whole lineage again. The watcher judges no step twice; its W&B run gets
    each eval once too (W&B offline restarts its step counter, so the sink cannot tell)."""
    from helpers import FakeWandbApi, FakeWandbRun

    from ladder.sources.wandb import WandbApiSource
    path, doc = prereg
    rows = [dict(r, _step=r["step"]) for r in _rows()]
    api = FakeWandbApi({"a1": FakeWandbRun([r for r in rows if r["progress"] <= 0.5], {}, "h"),
                        "b2": FakeWandbRun([r for r in rows if r["progress"] > 0.4], {}, "h")})
    logged = []
    for lineage in ("a1", "a1,b2"):
        wb = _Wandb()
        sink = WatchRunSink(doc, wandb_module=wb)
        w = Watcher(path, WandbApiSource(f"wandb://ent/proj/{lineage}", api=api), [sink],
                    tmp_path / "state.json")
        sink.attach(w)
        w.poll()
        sink.close()
        logged += [s for r, s in wb.runs[0].logs if "watch/loss" in r]
    evals = sorted(r["step"] for r in rows if METRIC in r)
    assert sorted(logged) == evals  # every eval, once
    assert w.state["n_evals"] == len(evals)  # and judged once


@pytest.mark.slow  # three offline W&B runs (~15 s)
def test_an_offline_wandb_group_read_back(prereg, tmp_path, monkeypatch, capsys):
    """preregister --wandb, then watch --wandb twice (a restarted watcher with --state): read
    back, the forecast run's rows sit under the live key at the target's steps, the watch run's
    rows at the watched run's steps in both of its offline segments (no restart at 0), and the
    alerts table was logged by each watcher that raised alerts."""
    from helpers import offline_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    path, doc = prereg
    law = tmp_path / "law.json"
    pts = sy.points_table([sy.make_run(TRUTH, t, seed=i)
                           for i, t in enumerate(sy.ladder_targets(5, steps0=60))])
    pts.to_csv(tmp_path / "pts.csv", index=False)
    assert main(["fit", str(tmp_path / "pts.csv"), "--form", "compute", "--bootstrap", "20",
                 "--out", str(law), "-q"]) == 0
    spec = tmp_path / "target.json"
    spec.write_text(json.dumps(dict(TARGET.to_dict(), name="lad:hero")))
    prereg = tmp_path / "p2.json"
    assert main(["preregister", str(law), "--target-spec", str(spec), "--wandb",
                 "--wandb-project", "proj", "--eval-noise", "0.003", "--out", str(prereg),
                 "-q"]) == 0
    doc = pr.load(prereg)
    rows = _rows(fault_at=0.3)
    m = tmp_path / "run" / "metrics.jsonl"
    m.parent.mkdir()
    half = [r for r in rows if r["progress"] <= 0.5]
    m.write_text("".join(json.dumps(r) + "\n" for r in half))
    state = tmp_path / "state.json"
    argv = ["watch", str(prereg), "--source", str(m), "--wandb", "--wandb-project", "proj",
            "--state", str(state), "-q"]
    main(argv)
    with open(m, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[len(half):])
    main(argv)

    records = offline_records
    wdir = tmp_path / "wandb"
    fdir, = wdir.glob(f"offline-run-*-{forecast_run_id(doc['sha256'])}")
    segs = sorted(wdir.glob(f"offline-run-*-{watch_run_id(doc['sha256'])}*"))
    assert len(segs) == 2
    frecs = records(fdir)
    frun = next(r for r in frecs if r["type"] == "run")["run"]
    centre, lo, hi = band_keys(doc["metric"])
    fhist = [r["history"] for r in frecs if r["type"] == "history"]
    by_step = {}
    for p in sorted(doc["forecast"], key=lambda p: p["fraction"]):
        by_step.setdefault(int(p["step"]), p)
    assert [h["step"]["num"] for h in fhist] == sorted(by_step)
    for h in fhist:
        p = by_step[h["step"]["num"]]
        assert h["item"]["step"] == h["step"]["num"]
        assert h["item"][centre] == pytest.approx(p["loss"])
    assert sum(lo in h["item"] and hi in h["item"] for h in fhist) > len(fhist) // 2
    evals = sorted(r["step"] for r in rows if doc["metric"] in r)
    seen, tables = [], 0
    for d in segs:
        recs = records(d)
        run = next(r for r in recs if r["type"] == "run")["run"]
        assert (run["job_type"], run["run_group"]) == ("watch", frun["run_group"]) == \
            ("watch", "lad")
        hist = [r["history"] for r in recs if r["type"] == "history"]
        assert all(h["step"]["num"] == h["item"]["step"] for h in hist)  # W&B's = the hero's
        seen.append([h["step"]["num"] for h in hist if "watch/loss" in h["item"]])
        tables += sum(any(k.startswith("watch/alerts") for k in h["item"]) for h in hist)
    assert seen[0] == [s for s in evals if s <= half[-1]["step"]]
    assert seen[1] == [s for s in evals if s > half[-1]["step"]]  # not from _step 0 again
    assert tables >= 2  # each watcher that raised alerts logged the table, not only at exit
    # the band chart, read back: the built-in line-series preset over each run's own table
    for d, want in ((fdir, {"forecast", "band lo", "band hi"}),
                    (segs[-1], {f"{doc['metric']} (live)", "forecast", "band lo", "band hi"})):
        spec = _visualized(records(d), "band")
        assert spec["panel_config"]["panelDefId"] == "wandb/lineseries/v0"
        table = _last_table(d, "band_table")
        keys = {r[1] for r in table["data"]}
        assert keys == want
    live = {r[0]: r[2] for r in table["data"] if r[1].endswith("(live)")}
    # the restarted watcher (--state: it reads only the new rows) draws every eval: its
    # chart's live curve starts from the one its first segment logged
    assert sorted(live) == seen[0] + seen[1]
    assert live == pytest.approx({r["step"]: r[doc["metric"]] for r in rows
                                  if r["step"] in live})


def _visualized(recs, key):
    """The chart W&B recorded for ``key`` (config ``_wandb.visualize.KEY``), as a dict."""
    for r in recs:
        for item in ((r.get("config") or {}).get("update") or []) if r["type"] == "config" \
                else []:
            if item.get("nested_key") == ["_wandb", "visualize", key]:
                return json.loads(item["value_json"])
    raise AssertionError(f"no chart logged under {key!r}")


def _last_table(run_dir, stem):
    """The last table a run logged under ``stem`` (its media file), as W&B wrote it."""
    files = sorted((run_dir / "files" / "media" / "table").glob(f"{stem}_*.table.json"),
                   key=lambda f: int(f.name[len(stem) + 1:].split("_")[0]))
    assert files, f"no {stem} table in {run_dir}"
    return json.loads(files[-1].read_text())


def test_watch_run_logs_the_updated_forecast_beside_the_frozen(prereg, tmp_path):
    """Issue 40: the watcher's run carries the updated final (labelled ``watch/updated_*``) at
    each poll's last step; the frozen numbers stay ``watch/expected``/``_lo``/``_hi``."""
    from ladder.predict.watch.rules.heading import updated_forecast

    path, doc = prereg
    m = tmp_path / "metrics.jsonl"
    m.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    wb = _Wandb()
    sink = WatchRunSink(doc, wandb_module=wb)
    w = Watcher(path, JsonlSource(m), [sink])
    sink.attach(w)  # the updated forecast too
    w.poll()
    sink.close()
    run = wb.runs[0]
    ups = [(r, s) for r, s in run.logs if "watch/updated_final" in r]
    want = updated_forecast(w.view, w.state["heading"])
    assert len(ups) == 1 and ups[0][1] == max(s for _, s in run.logs)
    assert ups[0][0]["watch/updated_final"] == want["final"]["loss"]
    assert ups[0][0]["watch/updated_lo"] < want["final"]["loss"] < ups[0][0]["watch/updated_hi"]
    assert run.summary["watch/updated_final"] == want["final"]["loss"]
