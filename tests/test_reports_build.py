"""`ladder report`: figures, tables and the self-contained page, on small synthetic artifacts that
follow the documented schemas (DESIGN.md §3). The synthetic ladder obeys a known law
L = E + A * C^-alpha exactly, so what the report must say about it is known in advance."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import chromium_dom

from ladder.cli.main import main as cli_main
from ladder.predict.prereg import seal
from ladder.reports.build import build_report
from ladder.reports.figdata import backtests, ladder_data
from ladder.reports.inputs import load_inputs, not_applicable_spans
from ladder.reports.page import render_html, render_summary
from ladder.reports.plots import plot_law, plot_watch
from ladder.reports.tables import forecast_rows, law_rows, param_intervals
from ladder.specs import get_ladder

E, A, ALPHA = 1.5, 19.0, 0.1   # the synthetic truth
BAND = 0.02                   # +-2% band of the known law
METRIC = "eval_dropless/loss"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def truth(compute):
    return E + A * np.asarray(compute, float) ** -ALPHA


class KnownLaw:
    """A law object with the documented API (predict/params/form/metric/to_json) whose values are
    the synthetic truth: the report's fitted curve must pass through the synthetic points."""

    form, metric = "compute", METRIC
    params = {"E": E, "A": A, "alpha": ALPHA}  # noqa: RUF012 (read-only here)

    def predict(self, compute=None, level=0.9, **_):
        loss = truth(compute)
        return type("P", (), {"loss": loss, "lo": loss * (1 - BAND), "hi": loss * (1 + BAND),
                              "level": level})()

    def to_json(self):
        return {"schema": "law/1", "form": self.form, "metric": self.metric,
                "expression": "L = E + A * C^-alpha", "params": dict(self.params),
                "uncertainty": {"method": "bootstrap", "level": 0.9,
                                "intervals": {"E": [1.45, 1.55], "A": [17.0, 21.0],
                                              "alpha": [0.095, 0.105]}},
                "diagnostics": {"backtest": {"folds": [
                    {"train_runs": 2, "held_out": ["103K-A47.8K"], "final_rel_err": [0.004]},
                    {"train_runs": 3, "held_out": ["170K-A82.1K"],
                     "final_rel_err": [-0.006]}]}}}


def _write_run(root: Path, rung, *, scale=1.0, upto=1.0, status="complete", spike_at=None):
    """A run directory of ``rung`` whose eval loss is ``scale`` x the truth at compute so far."""
    d = root / rung.ladder / rung.name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(
        {"schema": "run-config/1", "rung": rung.to_dict(), "train": {}, "mesh": {}}))
    rows, last = [], int(rung.steps * upto)
    k = np.log10(rung.compute()) - 10  # health signals drift a little with size, for the eye
    evals = set(rung.eval_steps())
    for step in range(1, last + 1):
        tokens = step * rung.tokens_per_step
        g = step / rung.steps
        row = {"step": step, "tokens": tokens, "progress": g, "time": float(step),
               "train/loss": float(truth(rung.compute(tokens)) * 1.02),
               "grad/norm": 1.0 + 0.2 * np.exp(-10 * g) + (3.0 if step == spike_at else 0.0),
               "moe/drop_frac": 0.03 + 0.01 * k * np.exp(-5 * g),
               "moe/router_entropy": 1.9 - 0.1 * g * k,
               "params/norm/router_bias": 0.5 * np.exp(-3 * g),
               "params/norm/attn": 10 + 2 * g}
        if step in evals:
            row[METRIC] = float(truth(rung.compute(tokens)) * scale)
            row["eval/loss"] = row[METRIC] * 1.01
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = rung.summary()
    final = {METRIC: rows[-1].get(METRIC)} if status == "complete" else {}
    (d / "summary.json").write_text(json.dumps({
        "schema": "run-summary/1", "status": status, "step": last, "steps": rung.steps,
        "ladder": rung.ladder, "rung": rung.name, "params": s["params"],
        "active_params": s["active_params"], "tokens": rung.tokens,
        "tokens_seen": last * rung.tokens_per_step, "compute": s["compute_no_lm_head"],
        "final": final}))
    return d


def _prereg(path: Path, hero) -> Path:
    fc = []
    for i in range(101):
        g = i / 100
        step = round(g * hero.steps)
        tokens = step * hero.tokens_per_step
        loss = float(truth(hero.compute(tokens))) if tokens else 8.0
        fc.append({"fraction": g, "step": step, "tokens": tokens, "loss": loss,
                   "lo": loss * (1 - BAND), "hi": loss * (1 + BAND)})
    s = hero.summary()
    fin = fc[-1]
    path.write_text(json.dumps(seal({
        "schema": "prereg/1", "metric": METRIC, "band_level": 0.9,
        "target": {"name": f"{hero.ladder}:{hero.name}", "params": s["params"],
                   "active_params": s["active_params"],
                   "tokens": hero.tokens, "steps": hero.steps, "compute": s["compute_no_lm_head"]},
        "forecast": fc, "final": {"loss": fin["loss"], "lo": fin["lo"], "hi": fin["hi"]}})))
    return path


@pytest.fixture(scope="module")
def ladder_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    lad = get_ladder("cpu")
    for rung in lad.rungs:
        _write_run(root, rung)
    return root, lad


def _hero_setup(tmp: Path, ladder_dir, *, scale=1.0, upto=1.0, alerts=()):
    root, lad = ladder_dir
    runs = tmp / "runs"
    shutil.copytree(root, runs)
    _write_run(runs, lad.target, scale=scale, upto=upto,
               status="complete" if upto >= 1 else "running", spike_at=lad.target.steps // 3)
    prereg = _prereg(tmp / "prereg.json", lad.target)
    alerts_path = tmp / "alerts.jsonl"
    alerts_path.write_text("".join(json.dumps(a) + "\n" for a in alerts))
    return runs, prereg, alerts_path


def _img_payloads(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


@pytest.fixture(scope="module")
def full_report(tmp_path_factory, ladder_dir):
    """One complete report, built once: every artifact present, the hero on its forecast."""
    tmp = tmp_path_factory.mktemp("full")
    runs, prereg, alerts = _hero_setup(tmp, ladder_dir)
    index = build_report(tmp / "out", runs=runs, law=KnownLaw(), prereg=prereg, alerts=alerts)
    return index, runs, prereg


def test_full_report_inside_band(full_report):
    index, runs, prereg = full_report
    html = index.read_text()
    imgs = _img_payloads(html)
    assert len(imgs) == 4 and all(b.startswith(PNG_MAGIC) for b in imgs)
    for key in ("ladder", "law", "watch", "health"):
        assert (index.parent / f"{key}.png").read_bytes().startswith(PNG_MAGIC)
    assert "http://" not in html and "https://" not in html and "<script" not in html
    summary = (index.parent / "summary.md").read_text()
    assert "Inside the pre-registered band" in summary
    assert "0 critical, 0 warning" in summary
    # forecast vs actual at 25/50/75/100%: the hero follows the truth, so the error is ~0
    rows = forecast_rows(load_inputs(runs=runs, law=KnownLaw(), prereg=prereg))
    assert [r["fraction"] for r in rows] == ["25%", "50%", "75%", "100%"]
    assert all(r["inside"] == "yes" for r in rows)


def test_report_says_outside_when_hero_drifts(tmp_path, ladder_dir):
    lad = ladder_dir[1]
    alert = {"time": 1.0, "step": lad.target.steps // 2, "tokens": 1, "fraction": 0.5,
             "kind": "above_band", "severity": "critical", "value": 3.0, "expected": 2.8,
             "lo": 2.75, "hi": 2.85, "direction": "worse", "message": "above band"}
    runs, prereg, alerts = _hero_setup(tmp_path, ladder_dir, scale=1.05, alerts=[alert])
    inp = load_inputs(runs=runs, law=KnownLaw(), prereg=prereg, alerts=alerts)
    summary = render_summary(inp, {})  # the figures are exercised by the other tests
    assert "OUTSIDE the pre-registered band (above)" in summary
    assert "1 critical" in summary
    assert [r["inside"] for r in forecast_rows(inp)] == ["above"] * 4
    # +5% everywhere (up to the linear interpolation of the 1% forecast grid at the eval's fraction)
    errs = [float(r["error"].rstrip("%")) for r in forecast_rows(inp)]
    assert errs == pytest.approx([5.0] * 4, abs=0.05), errs


def test_partial_target_and_missing_law(tmp_path, ladder_dir):
    runs, prereg, alerts = _hero_setup(tmp_path, ladder_dir, upto=0.6)
    inp = load_inputs(runs=runs, prereg=prereg, alerts=alerts)
    assert inp.target.status == "running" and inp.law is None
    # without a law the law figure still shows the finished rungs and the registered forecast
    assert plot_law(inp) is not None and plot_watch(inp) is not None
    rows = forecast_rows(inp)
    assert [r["inside"] for r in rows[:2]] == ["yes", "yes"]
    assert [r["actual"] for r in rows][2:] == ["not reached", "not reached"]
    html = render_html(inp, {}, {})
    hero = ladder_dir[1].target
    last_eval = max(st for st in hero.eval_steps() if st <= int(hero.steps * 0.6))
    assert "no law given" in html
    assert f"latest (at {last_eval / hero.steps:.0%} of the run)" in html


def test_nothing_given(tmp_path):
    index = build_report(tmp_path / "out")
    html = index.read_text()
    assert _img_payloads(html) == [] and html.count("Not drawn") == 4
    assert not list((tmp_path / "out").glob("*.png"))


def test_forecast_interpolation_hand_computed(tmp_path):
    prereg = tmp_path / "p.json"
    prereg.write_text(json.dumps(seal({"schema": "prereg/1", "target": {"name": "x"},
                                       "forecast": [
        {"fraction": 0.0, "loss": 4.0, "lo": 3.0, "hi": 5.0},
        {"fraction": 0.5, "loss": 3.0, "lo": 2.0, "hi": 4.0},
        {"fraction": 1.0, "loss": 2.0, "lo": 1.5, "hi": 2.5}]})))
    rows = forecast_rows(load_inputs(prereg=prereg))
    # linear interpolation: at 25% halfway between 4.0 and 3.0; at 75% between 3.0 and 2.0
    assert [r["forecast"] for r in rows] == ["3.500", "3.000", "2.500", "2.000"]
    assert rows[0]["band"] == "[2.500, 4.500]" and rows[2]["band"] == "[1.750, 3.250]"


def test_not_applicable_spans_and_backtests(tmp_path):
    prereg = tmp_path / "p.json"
    prereg.write_text(json.dumps(seal({"schema": "prereg/1",
                                       "target": {"name": "x", "steps": 200}, "forecast": []})))
    alerts = tmp_path / "a.jsonl"
    alerts.write_text("\n".join(json.dumps(a) for a in [
        {"step": 50, "kind": "not_applicable", "severity": "warn"},      # fraction from step
        {"fraction": 0.4, "kind": "spike", "severity": "warn"},
        {"fraction": 0.8, "kind": "not_applicable", "severity": "warn"}]) + "\n{partial")
    inp = load_inputs(prereg=prereg, alerts=alerts)
    # the watcher stops comparing once the forecast no longer applies: one span, to the end
    assert not_applicable_spans(inp) == [(0.25, 1.0)]
    meta = KnownLaw().to_json()
    assert backtests(meta) == [
        {"kind": "fit on 2 runs", "label": "103K-A47.8K", "rel_error": 0.004},
        {"kind": "fit on 3 runs", "label": "170K-A82.1K", "rel_error": -0.006}]
    # the fitter's folds: parallel held_out / final_rel_err lists, several runs held out
    folds = {"diagnostics": {"backtest": {"folds": [
        {"train_runs": 2, "held_out": ["cpu/a"], "final_rel_err": [0.01]},
        {"train_runs": 3, "held_out": ["cpu/b", "cpu/c"], "final_rel_err": [-0.02, 0.03]}]}}}
    assert [(r["kind"], r["label"], r["rel_error"]) for r in backtests(folds)] == [
        ("fit on 2 runs", "cpu/a", 0.01), ("fit on 3 runs", "cpu/b", -0.02),
        ("fit on 3 runs", "cpu/c", 0.03)]
    assert param_intervals(meta)["alpha"] == (0.095, 0.105)


def test_cli_report_and_bad_input(tmp_path, ladder_dir, capsys):
    _, prereg, alerts = _hero_setup(tmp_path, ladder_dir)
    out = tmp_path / "out"
    assert cli_main(["report", "--prereg", str(prereg), "--alerts", str(alerts),
                     "--out", str(out)]) == 0
    assert (out / "index.html").is_file() and (out / "watch.png").is_file()
    assert "report: " in capsys.readouterr().out
    assert cli_main(["report", "--law", str(tmp_path / "nope.json"), "--out", str(out)]) == 66
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "prereg/1"}))
    assert cli_main(["report", "--law", str(bad), "--out", str(out)]) == 65
    assert cli_main(["report", "--out", str(bad)]) == 73  # --out is a file
    err = capsys.readouterr().err
    assert "nope.json" in err and "field 'schema'" in err and "not a directory" in err


def test_reports_never_imports_jax():
    code = ("import sys, ladder.reports.build, ladder.reports.plots; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_page_loads_all_images_in_chromium(tmp_path, full_report, chromium):
    index = full_report[0]
    # A copy of the page with a script that records, after load, how many images decoded.
    probe = index.read_text().replace("</body>", """<script>
window.addEventListener('load', function () {
  var imgs = Array.from(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  var d = document.createElement('div'); d.id = 'probe';
  d.textContent = 'images ' + ok + '/' + imgs.length; document.body.appendChild(d);
});</script></body>""")
    page = tmp_path / "probe.html"
    page.write_text(probe)
    dom = chromium_dom(chromium, page.as_uri(), tmp_path / "profile")
    assert "images 4/4" in dom, dom[-500:]


@pytest.mark.slow  # ~10 s: a real multi-start fit, a pre-registration and a watch
def test_report_on_real_producer_artifacts(tmp_path, ladder_dir):
    """law.json, prereg.json and alerts.jsonl written by `ladder fit`, `ladder preregister` and
    `ladder watch` themselves (not by this test), on the synthetic ladder that follows the truth:
    the report reads them through the documented APIs and the hero lands inside its band."""
    root, lad = ladder_dir
    runs, _, _ = _hero_setup(tmp_path, ladder_dir)
    law, prereg, alerts = tmp_path / "law.json", tmp_path / "real_prereg.json", tmp_path / "a.jsonl"
    assert cli_main(["fit", str(root), "--form", "compute", "--bootstrap", "20",
                     "--out", str(law)]) == 0
    assert cli_main(["preregister", str(law), "--target", f"cpu:{lad.target.name}",
                     "--out", str(prereg)]) == 0
    hero_metrics = runs / "cpu" / lad.target.name / "metrics.jsonl"
    cli_main(["watch", str(prereg), "--source", str(hero_metrics), "--alerts", str(alerts)])
    index = build_report(tmp_path / "out", runs=runs, law=law, prereg=prereg, alerts=alerts)
    html = index.read_text()
    assert len(_img_payloads(html)) == 4
    inp = load_inputs(runs=runs, law=law, prereg=prereg, alerts=alerts)
    assert inp.law.obj is not None and inp.law.error is None   # fit.load_law rebuilt it
    assert inp.target is not None and inp.target.name == lad.target.name
    assert [r["parameter"] for r in law_rows(inp)] == ["E", "A", "alpha"]
    assert all(r["inside"] == "yes" for r in forecast_rows(inp)), forecast_rows(inp)


def test_not_applicable_is_not_judged(tmp_path, ladder_dir):
    """Once the watcher says the forecast no longer applies, the report does not call the run
    inside or outside the band (DESIGN.md §3: "forecast no longer applies" instead of comparing)."""
    lad = ladder_dir[1]
    na = {"time": "t", "step": lad.target.steps // 2, "tokens": None, "fraction": None,
          "kind": "not_applicable", "severity": "warn", "message": "planned steps changed"}
    runs, prereg, alerts = _hero_setup(tmp_path, ladder_dir, scale=1.05, alerts=[na])
    inp = load_inputs(runs=runs, prereg=prereg, alerts=alerts)
    summary = render_summary(inp, {})
    assert "no longer applies since 50% of the run (planned steps changed)" in summary
    assert "OUTSIDE" not in summary and "Inside" not in summary
    void = "not judged (forecast void)"  # from the not_applicable step (50%) on
    assert [r["inside"] for r in forecast_rows(inp)] == ["above", void, void, void]


def test_diverged_target(tmp_path, ladder_dir):
    """A target that diverged (NaN written as a string, status "diverged") is drawn and said."""
    runs, prereg, alerts = _hero_setup(tmp_path, ladder_dir, upto=0.5)
    d = runs / "cpu" / ladder_dir[1].target.name
    with open(d / "metrics.jsonl", "a") as f:
        step = int(ladder_dir[1].target.steps * 0.5) + 1
        f.write(json.dumps({"step": step, "progress": 0.5, "tokens": 1, METRIC: "NaN",
                            "train/loss": "NaN"}) + "\n")
    summary = json.loads((d / "summary.json").read_text())
    summary.update(status="diverged", step=step)
    (d / "summary.json").write_text(json.dumps(summary))
    inp = load_inputs(runs=runs, prereg=prereg, alerts=alerts)
    assert inp.target.nonfinite_steps(METRIC) == [step]
    assert plot_watch(inp) is not None
    lines = render_summary(inp, {})
    assert f"diverged at step {step} of {ladder_dir[1].target.steps}" in lines


def test_law_evaluated_at_the_right_compute(ladder_dir):
    """The ladder figure evaluates a whole-run law at each eval's compute so far (from the shared
    counter, via the rung spec in config.json): on rungs that follow the truth exactly, the
    residuals are zero at every eval point; for a law of final points, at the final points."""
    class TrajectoryTruth(KnownLaw):
        form = "trajectory"

    inp = load_inputs(runs=ladder_dir[0], law=TrajectoryTruth())
    res = ladder_data(inp).residuals
    assert len(res) == sum(len(r.series(METRIC)) for r in inp.rungs) == 4 * 20
    assert np.abs(res).max() < 1e-12
    res_final = ladder_data(load_inputs(runs=ladder_dir[0], law=KnownLaw())).residuals
    assert len(res_final) == 4 and np.abs(res_final).max() < 1e-12


def test_the_ladder_figure_evaluates_the_law_once_per_rung_and_drawing_evaluates_nothing(
        ladder_dir):
    """The figure's data is built once (reports.figdata): a law of whole runs is evaluated once
    per rung, for its curve and its residuals together; drawing that data asks the law nothing."""
    from ladder.reports.figdata import ladder_data
    from ladder.reports.plots import colors_for, draw_ladder

    calls = []

    class CountingTrajectory(KnownLaw):
        form = "trajectory"

        def predict(self, compute=None, level=0.9, **kw):
            calls.append(np.size(compute))
            return super().predict(compute=compute, level=level, **kw)

    inp = load_inputs(runs=ladder_dir[0], law=CountingTrajectory())
    d = ladder_data(inp)
    assert len(calls) == len(inp.rungs) == 4
    assert len(d.residuals) == 4 * 20 and np.abs(d.residuals).max() < 1e-12
    draw_ladder(d, colors_for(inp))
    assert len(calls) == 4


def test_the_metric_panels_are_computed_once_per_report(tmp_path, monkeypatch):
    """The small multiples, their table on the page and in the summary share one list."""
    import ladder.reports.inputs as ri
    computed = []
    real = ri.metric_panels
    monkeypatch.setattr(ri, "metric_panels", lambda inp: computed.append(1) or real(inp))
    rows = [{"fraction": g, "loss": 3.0, "lo": 2.9, "hi": 3.1} for g in (0.1, 0.5, 1.0)]
    doc = {"schema": "prereg/3", "metrics": ["a/loss", "b/loss"], "band_level": 0.9,
           "target": {"name": "t", "steps": 100, "tokens": 1e9},
           "forecasts": {k: {"forecast": rows, "final": rows[-1]} for k in ("a/loss", "b/loss")}}
    build_report(tmp_path / "rep", prereg=doc)
    assert (tmp_path / "rep" / "metrics.png").exists()
    assert "a/loss" in (tmp_path / "rep" / "summary.md").read_text()
    assert len(computed) == 1


# ------------------------------------------------ issue 38: the report's figures and tables


def test_the_law_title_says_what_the_axis_plots():
    """law.png plots loss - E when the law has an asymptote: its title's forecast (a loss)
    also says where the diamond sits on that axis."""
    from types import SimpleNamespace

    from ladder.reports.plots import _law_title
    d = SimpleNamespace(forecast_final={"loss": 1.894, "lo": 1.86, "hi": 1.93},
                        target_compute=1e17, finals=[("a", 1e16, 2.0)], target_name="hero",
                        subtract=1.134, form="compute", table=np.zeros((0, 2)))
    title = _law_title(d)
    assert "loss 1.894" in title and "loss - E: 0.76" in title
    assert "loss - E" not in _law_title(SimpleNamespace(**{**vars(d), "subtract": 0.0}))


def test_the_alert_table_has_no_step_none_and_no_answered_waiting_note(tmp_path, ladder_dir):
    from ladder.reports.tables import alert_counts, alert_rows
    runs, prereg, _ = _hero_setup(tmp_path, ladder_dir)
    wait = {"time": 0, "step": None, "fraction": None, "kind": "input", "severity": "info",
            "message": f"{runs}/x/metrics.jsonl: not there (yet); waiting"}
    note = {**wait, "message": "3 unreadable lines skipped"}
    alerts = tmp_path / "a.jsonl"
    alerts.write_text("".join(json.dumps(a) + "\n" for a in (wait, note)))
    inp = load_inputs(runs=runs, prereg=prereg, alerts=alerts)
    rows = alert_rows(inp)
    assert [r["message"] for r in rows] == [note["message"]]  # the run logged: start-up only
    assert rows[0]["step"] == "-" and "None" not in json.dumps(rows)
    assert alert_counts(inp) == {"info": 1}
    html = render_html(inp, {}, {})
    assert "not there (yet)" not in html and "Alerts (1)" in html


def test_the_decision_rule_is_one_sentence_with_every_rule_folded():
    from ladder.predict.watch import WatchConfig
    from ladder.predict.watch.rules import RULES, decision_rule_words
    from ladder.reports.tables import decision_rule
    short, items = decision_rule(decision_rule_words(WatchConfig(), 0.9))
    assert short.startswith("The verdict: ") and short.count(". ") == 0 and len(short) < 400
    assert "band" in short and len(items) >= len(RULES)


def test_the_ladder_figure_draws_the_forecast_from_the_smallest_fitted_fraction(tmp_path,
                                                                                ladder_dir):
    from ladder.reports.figdata import forecast_floor, ladder_data
    runs, prereg, alerts = _hero_setup(tmp_path, ladder_dir)
    doc = json.loads(prereg.read_text())
    doc["law"] = {"form": "trajectory", "diagnostics": {"fraction_range": [0.05, 1.0]}}
    from ladder.predict.prereg import sha256_of
    doc["law_sha256"] = sha256_of(doc["law"])
    prereg.write_text(json.dumps(seal({k: v for k, v in doc.items() if k != "sha256"})))
    inp = load_inputs(runs=runs, prereg=prereg, alerts=alerts)
    assert forecast_floor(inp) == pytest.approx(0.05)
    d = ladder_data(inp)
    first = min(p["tokens"] for p in doc["forecast"] if p["fraction"] >= 0.05)
    assert d.forecast.x.min() == pytest.approx(first)
    assert min(p["fraction"] for p in doc["forecast"]) < 0.05  # the grid itself starts earlier
    # a law of final points (compute: fitted at fraction 1) reads every point as a run's end
    doc["law"] = {"form": "compute", "diagnostics": {"fraction_range": [1.0, 1.0]}}
    doc["law_sha256"] = sha256_of(doc["law"])
    prereg.write_text(json.dumps(seal({k: v for k, v in doc.items() if k != "sha256"})))
    inp = load_inputs(runs=runs, prereg=prereg, alerts=alerts)
    assert forecast_floor(inp) < 1e-6 and len(ladder_data(inp).forecast.x) == \
        sum(p["tokens"] > 0 for p in doc["forecast"])


def test_the_law_table_says_fixed_and_not_identified(tmp_path):
    """The report's parameter table is the law's own (ladder.fit.report.parameter_rows): a
    fixed E says so (the asymptote rule's centre is often a fixed E)."""
    import pandas as pd

    from ladder.fit import fit_law
    from ladder.reports.tables import law_rows
    C = np.geomspace(1e17, 1e20, 6)
    df = pd.DataFrame({"run": [f"r{i}" for i in range(6)], "compute": C,
                       "loss": 1.9 + 300 * C ** -0.14})
    law = fit_law(df, form="compute", fix={"E": 1.9}, bootstrap=0, backtest=False)
    path = tmp_path / "law.json"
    path.write_text(json.dumps(law.to_json()))
    rows = {r["parameter"]: r for r in law_rows(load_inputs(law=path))}
    assert rows["E"]["note"] == "fixed" and rows["alpha"]["note"] == ""


def test_a_health_alert_is_drawn_on_the_panel_of_the_key_it_names():
    from ladder.reports.figdata import health_alert_for
    grad = {"kind": "grad_norm", "severity": "warn", "key": "grad/norm"}
    assert health_alert_for(grad, "grad/norm") and not health_alert_for(grad, "moe/drop_frac")
    cleared = {"kind": "cleared", "clears": "grad_norm", "severity": "info", "key": "grad/norm"}
    assert health_alert_for(cleared, "grad/norm")
    assert not health_alert_for({"kind": "above_band", "severity": "warn", "key": "grad/norm"},
                                "grad/norm")  # about the watched metric: the watch figure's
