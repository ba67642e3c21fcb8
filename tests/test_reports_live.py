"""The live page (`ladder report --serve`, `ladder watch --serve`) in a real headless Chromium: it
loads, shows the watch figure and the alerts, and refreshes them when points and alerts arrive."""

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import chromium_dom
from ladder.cli import main
from predict import prereg as pr
from predict import synthetic as sy
from predict.commands import make_prereg
from predict.live import Watcher
from predict.sources import JsonlSource
from reports.live import LivePage

TRUTH = sy.Truth()
TARGET = sy.ladder_targets(4, steps0=150)[-1]
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)


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

    page = LivePage.for_files(prereg=prereg, alerts=alerts, target_run=run, port=0,
                              poll_ms=300, before_state=arrive)
    try:
        with urllib.request.urlopen(page.url + "state.json", timeout=10) as r:  # first look
            first = json.loads(r.read())
        assert first["version"] == 1 and first["n_alerts"] == 1 and first["figure"]
        dom = chromium_dom(chromium, page.url, tmp_path / "profile", budget_ms=8000)
    finally:
        page.close()
    assert len(asked) >= 3, "the page did not poll"
    assert 'data-version="2"' in dom, dom[-800:]
    assert _rows_in(dom) == 3  # the table was redrawn with the two new alerts
    assert "above_band at step 820" in dom and "drop_frac at step 100" in dom
    # the refreshed figure (version 2) decoded in the browser
    assert re.search(r'data-figure="\d{3,}x\d{3,} v2"', dom), dom[:600]
    assert 'id="n-alerts">3<' in dom


def test_live_page_of_a_watcher(artifacts, tmp_path):
    prereg, run, _, rest = artifacts
    w = Watcher(prereg, JsonlSource(run / "metrics.jsonl"))
    page = LivePage.for_watcher(w, port=0)
    try:
        w.poll()
        s1, png1 = page.snapshot()
        with open(run / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rest)
        w.poll()  # the +3% shift from 60% of the run: loss alerts
        s2, png2 = page.snapshot()
        with urllib.request.urlopen(page.url, timeout=10) as r:
            html = r.read().decode()
        with urllib.request.urlopen(page.url + "watch.png", timeout=10) as r:
            assert r.read() == png2
    finally:
        page.close()
    assert s2["version"] == s1["version"] + 1 and png2 != png1
    assert s2["n_alerts"] == len(w.all_alerts) > s1["n_alerts"]
    assert any(a["kind"] == "above_band" for a in s2["alerts"])
    assert "state.json" in html and "<script" in html and "http" not in html.split("<script")[1]


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
        with urllib.request.urlopen(url + "state.json", timeout=30) as r:
            state = json.loads(r.read())
        assert state["figure"] and state["n_alerts"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
