"""One pre-registration for several metrics (issue 23, item 2): a synthetic ladder whose
per-metric laws are known -> `ladder fit --metric GLOB` (law/2) -> `ladder preregister`
(prereg/3, one sha256) -> `ladder verify` -> `ladder watch` judging every metric: one drifting
metric is caught and named, the others stay quiet; state per metric; a registered metric absent
from the source is said; a wide CSV (one column per key) works as a source; bad input exits 64+
with one line."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pandas as pd
import pytest
from helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.predict.watch import WatchConfig, check
from ladder.predict.watch.multi import MultiView, family_config, residual_order

# per-domain truths with g^-gamma = g^-alpha and no schedule terms: the loss at fraction g of a run
# of compute C_T is E + A (g C_T)^-alpha, which the "compute" form fits exactly
TRUTHS = {"paloma/c4_en/loss": sy.Truth(E=1.8, A=40.0, alpha=0.12, gamma=0.12, c1=0, c2=0),
          "paloma/wikitext/loss": sy.Truth(E=1.5, A=60.0, alpha=0.13, gamma=0.13, c1=0, c2=0),
          "paloma/reddit/loss": sy.Truth(E=2.2, A=30.0, alpha=0.11, gamma=0.11, c1=0, c2=0),
          "paloma/dolma/loss": sy.Truth(E=1.9, A=45.0, alpha=0.12, gamma=0.12, c1=0, c2=0)}
NOISE = sy.RunNoise(run_sigma=0.003, eval_sigma=0.003)
DRIFTING = "paloma/reddit/loss"


def _write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """The ladder fitted (law/2) and registered (prereg/3) once for the module."""
    d = tmp_path_factory.mktemp("multi")
    targets = sy.ladder_targets(6, ratio=2.5, steps0=60)
    rungs, target = targets[:5], targets[5]
    recs = []
    for i, t in enumerate(rungs):
        run = sy.make_multi_run(TRUTHS, t, noise=NOISE, seed=i)
        _write_jsonl(d / "runs" / t.name / "metrics.jsonl", run.rows)
        for r in run.rows:
            for k in TRUTHS:
                if k in r and r["progress"] >= 0.1 and round(r["progress"] * 100) % 10 == 0:
                    g = r["progress"]
                    recs.append({"run": t.name, "params": t.params,
                                 "active_params": t.active_params, "tokens": g * t.tokens,
                                 "compute": g * t.compute, "fraction": g, "metric": k,
                                 "loss": r[k]})
    pd.DataFrame(recs).to_csv(d / "points.csv", index=False)
    code, out, err = run_cli("fit", d / "points.csv", "--metric", "paloma/*/loss", "--form",
                             "compute", "--bootstrap", "40", "--out", d / "law.json")
    assert code == 0, err
    spec = d / "target.json"
    spec.write_text(json.dumps(target.to_dict()))
    code, out, err = run_cli("preregister", d / "law.json", "--target-spec", spec,
                             "--runs", d / "runs", "--out", d / "prereg.json")
    assert code == 0, err
    return d, target


def _watch(d, source, *extra):
    code, out, err = run_cli("watch", d / "prereg.json", "--source", source, "--json", *extra)
    return code, out, err


@pytest.mark.heavy  # 11 s on 2 busy cores
def test_prereg3_one_sha_per_metric_band_and_family_rule(registered):
    d, target = registered
    doc = json.loads((d / "prereg.json").read_text())
    assert doc["schema"] == "prereg/3"
    assert doc["metrics"] == sorted(TRUTHS) or set(doc["metrics"]) == set(TRUTHS)
    assert pr.verify(d / "prereg.json").ok
    for k, t in TRUTHS.items():
        f = doc["forecasts"][k]
        # the band of each metric holds its own truth at the end of the target's run
        truth = float(t.loss(target.compute, 1.0))
        assert f["final"]["lo"] < truth < f["final"]["hi"], (k, f["final"], truth)
        assert len(f["forecast"]) >= 100
    fam = doc["decision_rule"]["family"]
    # Sidak: per-metric alert level (1 - 0.01)^(1/4)
    assert fam["metrics"] == 4 and fam["alert_level"] == pytest.approx((1 - 0.01) ** 0.25)
    assert doc["decision_rule"]["parameters"]["alert_level"] == pytest.approx(fam["alert_level"])
    assert stat.S_IMODE(os.stat(d / "prereg.json").st_mode) & 0o222 == 0
    code, out, _ = run_cli("verify", d / "prereg.json")
    assert code == 0 and "OK" in out


def test_verify_names_an_edited_metric_forecast(registered, tmp_path):
    d, _ = registered
    doc = json.loads((d / "prereg.json").read_text())
    doc["forecasts"][DRIFTING]["final"]["hi"] += 0.1
    p = tmp_path / "edited.json"
    p.write_text(json.dumps(doc))
    v = pr.verify(p)
    assert not v.ok and any(c.startswith("forecasts") for c in v.changed)
    code, out, _ = run_cli("verify", p)
    assert code != 0 and "forecasts" in out


def test_one_drifting_metric_is_caught_and_named_the_others_quiet(registered, tmp_path):
    d, target = registered
    run = sy.make_multi_run(TRUTHS, target, noise=NOISE, seed=77,
                            faults={DRIFTING: sy.Fault("drift", 0.3, 0.05)})
    src = tmp_path / "metrics.jsonl"
    _write_jsonl(src, run.rows)
    code, out, err = _watch(d, src, "--alerts", tmp_path / "alerts.jsonl",
                            "--state", tmp_path / "state.json")
    assert code in (1, 2), err
    v = json.loads(out)
    rows = {r["metric"]: r for r in v["metrics"]}
    assert set(rows) == set(TRUTHS) and v["exit"] == code
    assert rows[DRIFTING]["worst"] in ("warn", "critical")
    for k in TRUTHS:
        if k != DRIFTING:
            assert rows[k]["worst"] is None, (k, rows[k])
        assert rows[k]["evals"] > 50 and not rows[k]["absent"]
    bad = [a for a in v["alerts"] if a["severity"] != "info"]
    assert bad and all(a.get("metric") == DRIFTING for a in bad), bad
    assert all(a["message"].startswith(f"[{DRIFTING}]") for a in bad)
    lines = [json.loads(x) for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert {a.get("metric") for a in lines if a["severity"] != "info"} == {DRIFTING}
    # a restart with the state repeats no alert (state per metric)
    code2, out2, err2 = _watch(d, src, "--state", tmp_path / "state.json")
    assert code2 == code, err2
    assert [a for a in json.loads(out2)["alerts"] if a["severity"] != "info"] == []
    st = json.loads((tmp_path / "state.json").read_text())["state"]
    assert st["schema"] == "watch-state-multi/1" and set(st["metrics"]) == set(TRUTHS)


def test_healthy_run_all_quiet_and_absent_metric_said(registered, tmp_path):
    d, target = registered
    run = sy.make_multi_run(TRUTHS, target, noise=NOISE, seed=5)
    for r in run.rows:
        r.pop("paloma/dolma/loss", None)
    src = tmp_path / "m.jsonl"
    _write_jsonl(src, run.rows)
    code, out, err = _watch(d, src)
    assert code == 0, err
    v = json.loads(out)
    assert v["absent"] == ["paloma/dolma/loss"]
    assert {r["metric"]: r["absent"] for r in v["metrics"]}["paloma/dolma/loss"] is True
    assert any(a["kind"] == "missing_metric" and a.get("metric") == "paloma/dolma/loss"
               for a in v["alerts"])
    # the text verdict lists every metric and says the absent one
    code, out, err = run_cli("watch", d / "prereg.json", "--source", src)
    assert code == 0
    for k in TRUTHS:
        assert k in err
    assert "ABSENT" in err


def test_wide_wandb_csv_one_column_per_key_is_a_source(registered, tmp_path):
    d, target = registered
    run = sy.make_multi_run(TRUTHS, target, noise=NOISE, seed=9,
                            faults={DRIFTING: sy.Fault("shift", 0.4, 0.06)})
    evals = [r for r in run.rows if DRIFTING in r]
    df = pd.DataFrame([{"_step": r["step"], **{f"hero - {k}": r[k] for k in TRUTHS}}
                       for r in evals])
    src = tmp_path / "export.csv"
    df.to_csv(src, index=False)
    code, out, err = _watch(d, src)
    assert code in (1, 2), err
    v = json.loads(out)
    rows = {r["metric"]: r for r in v["metrics"]}
    assert rows[DRIFTING]["worst"] in ("warn", "critical")
    assert all(rows[k]["worst"] is None for k in TRUTHS if k != DRIFTING), rows


def test_check_multi_matches_check_of_each_metric_alone(registered):
    """The per-metric verdict is the single-metric watcher's on that metric's column."""
    d, target = registered
    doc = pr.load(d / "prereg.json")
    mv = MultiView.of(doc)
    run = sy.make_multi_run(TRUTHS, target, noise=NOISE, seed=3,
                            faults={DRIFTING: sy.Fault("shift", 0.5, 0.05)})
    res = check(mv, run.rows, None, now=0)
    from ladder.predict.watch.multi import metric_doc
    for k in TRUTHS:
        alone = check(metric_doc(doc, k), [{kk: v for kk, v in r.items()
                                            if kk in ("step", "tokens", "progress", "time", k)}
                                           for r in run.rows], None, now=0)
        assert alone.state["worst"] == res.state["metrics"][k]["worst"], k
        assert alone.state["band"]["ema"] == pytest.approx(res.state["metrics"][k]["band"]["ema"])
    assert residual_order(mv, res.state)[0] == DRIFTING


def test_family_config_sidak_and_one_metric_unchanged():
    cfg = WatchConfig()
    same, rec = family_config(cfg, 1)
    assert same.alert_level == pytest.approx(cfg.alert_level)
    assert same.trend_noise_k == pytest.approx(cfg.trend_noise_k)
    c16, rec16 = family_config(cfg, 16)
    p16 = 1 - c16.alert_level
    assert 1 - (1 - p16) ** 16 == pytest.approx(1 - cfg.alert_level)
    assert c16.trend_noise_k > cfg.trend_noise_k and rec16["z_scale"] > 1.2
    with pytest.raises(ValueError):
        family_config(cfg, 0)


@pytest.mark.parametrize("edit,field", [
    (lambda doc: doc.pop("forecasts"), "forecasts"),
    (lambda doc: doc.__setitem__("metrics", []), "metrics"),
    (lambda doc: doc["forecasts"].pop(DRIFTING), f"forecasts.{DRIFTING}"),
])
def test_bad_multi_prereg_one_line_64(registered, tmp_path, edit, field):
    d, _ = registered
    doc = json.loads((d / "prereg.json").read_text())
    edit(doc)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(pr.seal(doc)))
    code, out, err = run_cli("watch", p, "--source", d / "runs" / "rung0" / "metrics.jsonl")
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code >= 64 and len(lines) == 1 and field in lines[0], (code, err)


def test_metric_flag_refused_on_multi(registered, tmp_path):
    d, _ = registered
    code, out, err = run_cli("watch", d / "prereg.json", "--source",
                             d / "runs" / "rung0" / "metrics.jsonl", "--metric", "x")
    assert code == 64 and len(err.strip().splitlines()) == 1 and "--metric" in err


def test_report_small_multiples_in_residual_order(registered, tmp_path):
    """Item 3: `ladder report` of a multi-metric pre-registration draws one panel per metric,
    the largest residual first; the per-metric table follows the same order."""
    from ladder.reports.inputs import load_inputs
    d, target = registered
    second = "paloma/c4_en/loss"
    run = sy.make_multi_run(TRUTHS, target, noise=NOISE, seed=21,
                            faults={DRIFTING: sy.Fault("shift", 0.4, 0.08),
                                    second: sy.Fault("shift", 0.4, 0.03)})
    rd = tmp_path / "hero"
    _write_jsonl(rd / "metrics.jsonl", run.rows)
    alerts = tmp_path / "alerts.jsonl"
    code, _, err = run_cli("watch", d / "prereg.json", "--source", rd / "metrics.jsonl",
                           "--alerts", alerts)
    assert code in (1, 2), err
    code, out, err = run_cli("report", "--prereg", d / "prereg.json", "--target-run", rd,
                             "--alerts", alerts, "--out", tmp_path / "rep")
    assert code == 0, err
    assert (tmp_path / "rep" / "metrics.png").stat().st_size > 10_000
    inp = load_inputs(prereg=d / "prereg.json", target_run=rd, alerts=alerts)
    ps = inp.panels
    assert [p.metric for p in ps][:2] == [DRIFTING, second]
    res = [abs(p.residual) for p in ps]
    assert res == sorted(res, reverse=True)
    assert ps[0].residual == pytest.approx(0.08, abs=0.02) and ps[0].worst is not None
    assert all(a.get("metric") == ps[0].metric for a in ps[0].alerts)
    html = (tmp_path / "rep" / "index.html").read_text()
    pos = [html.index(f"<td>{k}</td>") for k in [p.metric for p in ps]]
    assert pos == sorted(pos)
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert md.index(DRIFTING) < md.index(second)


def test_single_metric_report_draws_no_small_multiples(tmp_path):
    from ladder.reports.build import build_report
    from ladder.reports.inputs import load_inputs
    one = {"schema": "prereg/1", "metric": "eval_dropless/loss",
           "target": {"name": "t", "steps": 100, "tokens": 1e9},
           "forecast": [{"fraction": g, "loss": 3.0, "lo": 2.9, "hi": 3.1}
                        for g in (0.1, 0.5, 1.0)], "final": {"loss": 3.0}, "band_level": 0.9}
    p = tmp_path / "one.json"
    p.write_text(json.dumps(pr.seal(one)))
    build_report(tmp_path / "rep", prereg=p)
    assert not (tmp_path / "rep" / "metrics.png").exists()
    assert (tmp_path / "rep" / "watch.png").exists()
    assert load_inputs(prereg=p).panels == []


def test_live_page_panels_one_per_metric_worst_first(registered, tmp_path, chromium):
    """Item 3, the live page: a multi-metric watch's page (and `report --serve`'s) shows the
    report's small multiples, one chart per metric, and says them in the residual order, in a
    real browser."""
    import re
    import time

    from conftest import chromium_dom

    from ladder.predict.live import Watcher
    from ladder.sources import JsonlSource
    from ladder.reports.inputs import load_inputs
    from ladder.reports.live import LivePage, files_state
    d, target = registered
    run = sy.make_multi_run(TRUTHS, target, noise=NOISE, seed=31,
                            faults={DRIFTING: sy.Fault("shift", 0.4, 0.08)})
    src = tmp_path / "hero" / "metrics.jsonl"
    _write_jsonl(src, run.rows)
    w = Watcher(d / "prereg.json", JsonlSource(src))
    page = LivePage.for_watcher(w, port=0, poll_ms=300)
    try:
        w.poll()
        s = page.snapshot()
        panels = page.feed.inputs([]).panels
        while not page.drawings and page.draw_error is None:
            time.sleep(0.05)
        dom = chromium_dom(chromium, page.url, tmp_path / "profile", budget_ms=4000)
    finally:
        page.close()
    order = [line.split(":")[0] for line in s["verdict"][:len(TRUTHS)]]
    assert order[0] == DRIFTING and sorted(order) == sorted(TRUTHS)
    assert "worst alert none" not in s["verdict"][0]
    assert all("worst alert none" in line for line in s["verdict"][1:len(TRUTHS)])
    # the figure's panels: the same metrics, worst first, every eval of each
    assert [p.metric for p in panels][0] == DRIFTING and len(panels) == len(TRUTHS)
    assert all(len(p.series) == 100 for p in panels)
    assert page.draw_error is None and page.chart()[:4] == b"\x89PNG"
    assert re.search(r'<img id="chart"[^>]* src="chart.png\?v=1"', dom), dom[:800]
    # the files' page (report --serve) orders them the same way
    fs = files_state(load_inputs(prereg=d / "prereg.json", target_run=src.parent))
    assert fs["verdict"][0].split(":")[0] == DRIFTING


def test_at_step_amendment_of_a_multi_prereg_is_a_one_line_refusal(registered, tmp_path):
    d, _ = registered
    src = d / "runs" / "rung0" / "metrics.jsonl"
    code, out, err = run_cli("preregister", "--amend", d / "prereg.json", "--reason", "mix",
                             "--at-step", "10", "--source", src, "--data-tag", "b",
                             "--multiplier", "1.1", "--out", d / "amended.json")
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code == 64 and len(lines) == 1 and "--at-step" in lines[0], (code, err)
    assert not (d / "amended.json").exists()


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True),
                  st.text(max_size=4), st.lists(st.integers(), max_size=2),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(["metrics", "forecasts", "forecasts.KEY", "forecasts.KEY.forecast",
                              "forecasts.KEY.final", "forecasts.KEY.forecast.0",
                              "decision_rule.family", "target"]),
       value=_JUNK)
def test_any_edit_of_a_multi_prereg_resealed_is_judged_or_refused_in_one_line(registered,
                                                                              where, value):
    """Property: a prereg/3 file with any section replaced by junk (and resealed, so it passes
    the hash) is watched or refused with one line and exit 64+, never a traceback."""
    import tempfile
    d, _ = registered
    doc = json.loads((d / "prereg.json").read_text())
    node, parts = doc, where.replace("KEY", DRIFTING).split(".")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "edited.json"
        p.write_text(json.dumps(pr.seal(doc)))
        code, out, err = run_cli("watch", p, "--source", d / "runs" / "rung0" / "metrics.jsonl")
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert "Traceback" not in err
    assert code in (0, 1, 2, 3) or (code >= 64 and len(lines) == 1), (code, err)
