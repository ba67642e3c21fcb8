"""The live page (`ladder report --serve`, `ladder watch --serve`) in a real headless Chromium: it
loads, shows the report's watch figure (drawn on the server) and the alerts, and refreshes them
when points and alerts arrive; the chart is drawn once per new version, throttled, never for a
poll; the watcher's page follows the watcher (its judged batches, never the metrics file again)
with bounded series; the server answers only its own Host and a crowd of clients at once."""

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import chromium_dom

from ladder.cli.main import main
from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.predict.live import Watcher
from ladder.predict.prereg import make_prereg
from ladder.sources import JsonlSource
from ladder.reports.inputs import load_inputs
from ladder.reports.live import Downsampled, LivePage
from ladder.reports.plots import plot_watch, png_bytes

TRUTH = sy.Truth()
TARGET = sy.ladder_targets(4, steps0=150)[-1]
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)
DOC = make_prereg(LAW, TARGET, eval_noise=0.003, created="2026-01-01T00:00:00Z")


def _alert(step, kind, severity="warn"):
    return {"time": "2026-01-01T00:00:00Z", "step": step, "tokens": None,
            "fraction": step / TARGET.steps, "kind": kind, "severity": severity,
            "value": None, "expected": None, "lo": None, "hi": None, "direction": None,
            "message": f"{kind} at step {step}"}


@pytest.fixture
def artifacts(tmp_path):
    doc = make_prereg(LAW, TARGET, eval_noise=0.003, created="2026-01-01T00:00:00Z")
    prereg = tmp_path / "prereg.json"
    pr.write_once(prereg, doc)
    run = tmp_path / "target"
    run.mkdir()
    rows = sy.make_run(TRUTH, TARGET, seed=1, fault=sy.Fault("shift", 0.6, 0.03)).rows
    half = [r for r in rows if r["progress"] <= 0.5]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in half))
    alerts = tmp_path / "alerts.jsonl"
    alerts.write_text(json.dumps(_alert(100, "drop_frac")) + "\n")
    return prereg, run, alerts, rows[len(half):]


def _drawn(page: LivePage, n: int) -> bytes:
    """The page's chart once its ``n``-th drawing is done."""
    deadline = time.monotonic() + 60
    while page.drawings < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert page.drawings >= n and page.draw_error is None, (page.drawings, page.draw_error)
    return page.chart()


def _rows_in(dom: str) -> int:
    body = re.search(r'<tbody id="alerts">(.*?)</tbody>', dom, re.S)
    return body.group(1).count("<tr>") if body else -1


def test_live_page_refreshes_as_points_and_alerts_arrive(artifacts, tmp_path, chromium):
    prereg, run, alerts, rest = artifacts
    asked = []

    def arrive():  # the run goes on between the page's first and second look at the state
        asked.append(1)
        if len(asked) == 2:
            with open(run / "metrics.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rest)
            with open(alerts, "a") as f:
                f.write(json.dumps(_alert(800, "above_band")) + "\n")
                f.write(json.dumps(_alert(820, "above_band", "critical")) + "\n")
        if len(asked) == 3:  # the browser's next look finds the chart of version 2 drawn
            _drawn(page, 2)

    page = LivePage.for_files(prereg=prereg, alerts=alerts, target_run=run, port=0,
                              poll_ms=300, redraw_s=0)
    body = page.body  # /state.json's answer: the run goes on just before it

    def arrive_then_body():
        arrive()
        return body()
    page.body = arrive_then_body
    try:
        with urllib.request.urlopen(page.url + "state.json", timeout=10) as r:  # first look
            first = json.loads(r.read())
        assert first["version"] == 1 and first["n_alerts"] == 1
        dom = chromium_dom(chromium, page.url, tmp_path / "profile", budget_ms=8000)
        with urllib.request.urlopen(page.url + "chart.png?v=2", timeout=10) as r:
            served = r.read()
    finally:
        page.close()
    assert len(asked) >= 3, "the page did not poll"
    assert 'data-version="2"' in dom, dom[-800:]
    assert _rows_in(dom) == 3  # the table was redrawn with the two new alerts
    assert "above_band at step 820" in dom and "drop_frac at step 100" in dom
    assert 'id="n-alerts">3<' in dom
    # the chart of version 2: the report's own watch figure of the files as they are now
    assert re.search(r'<img id="chart"[^>]* src="chart.png\?v=2"', dom), dom[:800]
    now = load_inputs(prereg=prereg, alerts=alerts, target_run=run)
    assert served == png_bytes(plot_watch(now))


def test_live_page_of_a_watcher_follows_the_watcher_not_the_file(artifacts, tmp_path,
                                                                 chromium):
    """The watcher's page is fed by the batches the watcher judges: with the metrics file gone
    it still draws every point; a refresh rebuilds the state only when the watch moved on, and
    the chart changes with it."""
    prereg, run, _, rest = artifacts
    w = Watcher(prereg, JsonlSource(run / "metrics.jsonl"))
    page = LivePage.for_watcher(w, port=0, poll_ms=300, redraw_s=0)
    try:
        w.poll()
        s1 = page.snapshot()
        first = _drawn(page, 1)
        assert page.snapshot()["version"] == s1["version"]  # nothing new: the same state
        with open(run / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rest)
        w.poll()  # the +3% shift from 60% of the run: loss alerts
        os.rename(run / "metrics.jsonl", run / "gone.jsonl")  # the page never reads it
        s2 = page.snapshot()
        second = _drawn(page, 2)
        dom = chromium_dom(chromium, page.url, tmp_path / "profile", budget_ms=4000)
        with urllib.request.urlopen(page.url, timeout=10) as r:
            html = r.read().decode()
    finally:
        page.close()
    assert s2["version"] == s1["version"] + 1
    assert first[:4] == second[:4] == b"\x89PNG" and first != second
    x, _ = page.feed.metric.points()
    evals = [r for r in rest if "eval_dropless/loss" in r]
    assert len(x) == 100 and len(evals) < 100  # every eval of both polls, once each
    assert s2["n_alerts"] == len(w.all_alerts) > s1["n_alerts"]
    assert any(a["kind"] == "above_band" for a in s2["alerts"])
    # the words and the tone follow the alerts: a warning raised, the border is the warning's
    worst = "critical" if any(a["severity"] == "critical" for a in s2["alerts"]) else "warn"
    assert any("above the band" in line for line in s2["verdict"])
    assert s2["tone"] == {"warn": "warn", "critical": "bad"}[worst]
    assert "state.json" in html and "<script" in html and "http" not in html.split("<script")[1]
    assert 'data-version="2"' in dom and re.search(r'src="chart.png\?v=2"', dom), dom[:800]


def _figure(v: int):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(2, 1))
    fig.text(0.5, 0.5, f"version {v}")
    return fig


def test_the_chart_is_drawn_once_per_new_version_at_most_once_per_redraw_s():
    """Polls at an unchanged version answer the cached chart (no drawing); versions that come
    faster than ``redraw_s`` are drawn once, the newest."""
    version, drew = [1], []

    def state():
        v = version[0]
        return {"verdict": [], "tone": "", "alerts": [], "n_alerts": 0,
                "chart": lambda: drew.append(v) or _figure(v)}

    page = LivePage(state, lambda: version[0], port=0, redraw_s=1.0)
    try:
        page.body()
        first = _drawn(page, 1)
        for _ in range(50):
            with urllib.request.urlopen(page.url + "state.json", timeout=10) as r:
                assert json.loads(r.read())["chart"] == "chart.png?v=1"
        with urllib.request.urlopen(page.url + "chart.png?v=1", timeout=10) as r:
            assert r.read() == first == png_bytes(_figure(1))
        assert drew == [1]
        t0 = time.monotonic()
        for v in (2, 3, 4):  # three new versions within redraw_s of the first drawing
            version[0] = v
            page.body()
        last = _drawn(page, 2)
        waited = time.monotonic() - t0
        time.sleep(0.3)
    finally:
        page.close()
    assert drew == [1, 4] and last == png_bytes(_figure(4))
    assert waited > 0.5  # held back to redraw_s after the first drawing
    assert page.snapshot()["chart"] == "chart.png?v=2"


def test_the_page_of_a_restarted_watcher_reads_the_run_once_for_its_history(artifacts,
                                                                            tmp_path):
    """A watcher restarted from its state file does not read what it judged before; its page
    reads the run once, in the background, and draws it from the start."""
    prereg, run, _, rest = artifacts
    src = run / "metrics.jsonl"
    state = tmp_path / "state.json"
    Watcher(prereg, JsonlSource(src), [], state).poll()
    with open(src, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rest)
    w = Watcher(prereg, JsonlSource(src), [], state)
    page = LivePage.for_watcher(w, port=0, source=str(src))
    try:
        page.feed.history_thread.join(60)
        w.poll()
    finally:
        page.close()
    assert page.feed.history_error is None
    x, _ = page.feed.metric.points()
    assert len(x) == 100 and min(x) <= 0.01  # from the start of the run


def test_the_watch_figure_draws_the_train_loss_without_widening_its_y_range(artifacts,
                                                                             tmp_path):
    """The run's train loss is the watch figure's data when logged (the report's files and the
    watcher's feed alike), drawn as a labelled line, and the y range is the one without it (the
    early train loss sits far above it); a run without train loss draws no such line."""
    from ladder.reports.figdata import watch_data
    from ladder.reports.live import WatcherFeed
    from ladder.reports.plots import draw_watch

    prereg, run, _, _ = artifacts
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "train/loss"}) + "\n" for r in rows))
    with_train = watch_data(load_inputs(prereg=prereg, target_run=run))
    without = watch_data(load_inputs(prereg=prereg, target_run=bare))
    assert without.train is None
    logged = [(r["progress"], r["train/loss"]) for r in rows]
    assert list(zip(with_train.train.fraction, with_train.train.value)) == logged
    assert with_train.ylim == without.ylim and max(v for _, v in logged) > without.ylim[1]
    figs = [draw_watch(d) for d in (with_train, without)]
    labels = [f.axes[0].get_legend_handles_labels()[1] for f in figs]
    assert "train loss (train/loss)" in labels[0] and not any("train" in x for x in labels[1])
    assert figs[0].axes[0].get_ylim() == figs[1].axes[0].get_ylim()

    w = Watcher(prereg, JsonlSource(run / "metrics.jsonl"))
    feed = WatcherFeed(w)
    w.poll()
    live = watch_data(feed.inputs([]))
    assert live.ylim == with_train.ylim
    assert live.train is not None and set(live.train.value) <= {v for _, v in logged}
    assert len(live.train.value) <= 2 * 1000 and len(live.train.value) > len(live.value)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.text("abxyz -", max_size=3), st.none()), min_size=1, max_size=60))
def test_any_logged_train_loss_leaves_the_watch_y_range_as_it_was(train):
    """Whatever a run logs as train loss (huge, negative, NaN, words), the watch figure's data
    carries its finite values and the y range is the one without it."""
    from ladder.reports.figdata import watch_data
    from ladder.reports.inputs import ReportInputs, RunData

    def inputs(with_train: bool):
        rows = []
        for i, v in enumerate(train):
            row = {"step": i + 1, "progress": (i + 1) / len(train),
                   "eval_dropless/loss": 3.0 - (i + 1) / len(train)}
            if with_train:
                row["train/loss"] = v
            rows.append(row)
        run = RunData(path=Path("target"), rows=rows)
        return ReportInputs(rungs=[], target=run, law=None, prereg=DOC, alerts=None, notes=[])

    d, d0 = watch_data(inputs(True)), watch_data(inputs(False))
    finite = [float(v) for v in train if isinstance(v, float) and math.isfinite(v)]
    assert d0.train is None and d.ylim == d0.ylim
    assert (d.train.value.tolist() if d.train is not None else []) == finite


def test_downsampled_series_stay_bounded_and_keep_spikes():
    ds = Downsampled(buckets=100)
    x = np.linspace(0, 1, 1_000_001)
    y = np.sin(20 * x)
    y[123_457] = 9.0  # one spike among a million points
    for a in range(0, len(x), 100_000):  # as batches arrive
        ds.add(x[a:a + 100_000], y[a:a + 100_000])
    xs, ys = ds.points()
    assert ds.n == len(x) and len(xs) <= 2 * 125 and np.all(np.diff(xs) >= 0)
    assert 9.0 in ys and ys.min() == pytest.approx(-1, abs=1e-3)
    assert ds.last == (1.0, pytest.approx(np.sin(20.0)))


def _get(url: str, host: str | None):
    req = urllib.request.Request(url)
    if host is not None:
        req.add_unredirected_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_only_this_machines_host_is_served(artifacts):
    prereg, *_ = artifacts
    page = LivePage.for_files(prereg=prereg, port=0)
    port = page.port
    try:
        url = page.url + "state.json"
        assert _get(url, f"127.0.0.1:{port}") == 200
        assert _get(url, f"localhost:{port}") == 200
        assert _get(url, "LOCALHOST") == 200
        # a page elsewhere that resolves its own name to 127.0.0.1 (DNS rebinding)
        assert _get(url, f"attacker.example:{port}") == 403
        assert _get(url, "attacker.example") == 403
        assert _get(url, f"localhost:{port + 1}") == 403
        assert _get(url, f"127.0.0.1.attacker.example:{port}") == 403
    finally:
        page.close()


def test_two_hundred_clients_at_once_are_all_answered(artifacts):
    """Issue 26 item 8: with the standard library's listen queue of 5, 52 of 200 simultaneous
    requests got no answer within 20 s; here every one is answered."""
    prereg, run, alerts, _ = artifacts
    page = LivePage.for_files(prereg=prereg, target_run=run, alerts=alerts, port=0)
    n = 200
    start = threading.Barrier(n)
    codes = [None] * n

    def client(i):
        start.wait()
        try:
            codes[i] = _get(page.url + "state.json", None)
        except OSError as e:
            codes[i] = type(e).__name__
    try:
        page.snapshot()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        page.close()
    assert codes == [200] * n, {c: codes.count(c) for c in set(codes)}


def test_port_in_use_is_a_one_line_error(artifacts):
    from ladder.io import InputError
    prereg, run, alerts, _ = artifacts
    page = LivePage.for_files(prereg=prereg, port=0)
    try:
        with pytest.raises(InputError, match="--port"):
            LivePage.for_files(prereg=prereg, port=page.httpd.server_address[1])
    finally:
        page.close()


def test_watch_serve_and_report_serve_from_the_command_line(artifacts, tmp_path, capsys):
    prereg, run, alerts, _ = artifacts
    code = main(["watch", str(prereg), "--source", str(run / "metrics.jsonl"), "--serve",
                 "--port", "0"])
    assert code == 0 and "live page on http://127.0.0.1:" in capsys.readouterr().err
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "ladder", "report", "--prereg", str(prereg),
                             "--target-run", str(run), "--alerts", str(alerts), "--serve",
                             "--port", "0"], cwd=root, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        line = proc.stdout.readline()
        assert line.startswith("live page: http://127.0.0.1:"), line
        url = line.split()[2]
        for _ in range(300):  # the first drawing of the chart, in the page's own thread
            with urllib.request.urlopen(url + "state.json", timeout=30) as r:
                state = json.loads(r.read())
            if state["chart"]:
                break
            time.sleep(0.1)
        assert "forecast" in state["verdict"][0] and state["n_alerts"] == 1
        with urllib.request.urlopen(url + state["chart"], timeout=30) as r:
            assert r.headers["Content-Type"] == "image/png" and r.read()[:4] == b"\x89PNG"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class _Band:
    def at(self, frac):
        return 2.0, 1.9, 2.1


@pytest.mark.parametrize("worst,tone", [(None, "ok"), ("warn", "warn"), ("critical", "bad")])
def test_the_verdict_words_and_tone_follow_the_alerts(worst, tone):
    """Issue 38: one eval above the band showed 'ABOVE' with a red border beside '0 warning'.
    The latest eval's side is said in words; the tone is the alerts' own."""
    from ladder.reports.live import verdict
    counts = {"warn": 1} if worst == "warn" else {"critical": 1} if worst else {}
    lines, got = verdict("hero", "loss", _Band(), 0.9, (0.4, 2.3), worst=worst,
                         not_applicable=None, counts=counts)
    assert got == tone
    assert "above the band at this eval" in lines[0] and "ABOVE" not in " ".join(lines)
    assert ("not an alert" in lines[0]) == (worst is None)
    lines, got = verdict("hero", "loss", _Band(), 0.9, (0.4, 2.0), worst=None,
                         not_applicable=None, counts={})
    assert got == "ok" and "inside" in lines[0]
