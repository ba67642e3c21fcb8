"""The pure watcher core against runs drawn from a known truth (tests/synthetic.py)."""

import json
import math

import numpy as np
import pytest

from tests import synthetic as sy
from ladder.predict.prereg import make_prereg
from ladder.predict.watch import Batch, WatchConfig, check, exit_code_for

TRUTH = sy.Truth()
TARGET = sy.ladder_targets(4, steps0=150)[-1]   # 1200 steps, an eval every 1%
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)
NOISE = sy.RunNoise(run_sigma=0.005, eval_sigma=0.003)


@pytest.fixture(scope="module")
def doc():
    return make_prereg(LAW, TARGET, eval_noise=NOISE.eval_sigma, created="2026-01-01T00:00:00Z")


def run(fault="none", at=0.5, size=0.02, seed=0, offset=0.0):
    return sy.make_run(TRUTH, TARGET, noise=NOISE, fault=sy.Fault(fault, at, size), seed=seed,
                       offset=offset).rows


def kinds(alerts):
    return [(a.kind, a.severity) for a in alerts]


def test_healthy_run_on_the_forecast_raises_nothing(doc):
    res = check(doc, run(offset=0.0, seed=1), None, now=0)
    assert [a for a in res.alerts if a.severity != "info"] == []
    assert res.exit_code == 0
    assert res.state["n_evals"] == 100  # one eval per 1%, all at or after 1% of the run


def test_shift_of_two_percent_is_detected_soon_after_onset_and_named_worse(doc):
    res = check(doc, run("shift", at=0.5, size=0.02, seed=2), None, now=0)
    band = [a for a in res.alerts if a.kind == "above_band"]
    assert band and band[0].severity == "warn" and band[0].direction == "worse"
    onset = int(0.5 * TARGET.steps)
    # k_consecutive = 3 evals at 1% spacing: the warning lands within a few evals of the onset
    assert onset <= band[0].step <= onset + 5 * TARGET.steps // 100
    assert band[0].value > band[0].hi  # the smoothed value is really outside the alert band
    assert res.exit_code == 2  # far outside soon: critical
    assert any(a.severity == "critical" for a in band)


def test_better_than_forecast_is_below_band(doc):
    res = check(doc, run("shift", at=0.3, size=-0.03, seed=3), None, now=0)
    below = [a for a in res.alerts if a.kind == "below_band"]
    assert below and below[0].direction == "better"
    assert not [a for a in res.alerts if a.kind == "above_band"]


def test_hysteresis_clear_after_the_run_returns_inside(doc):
    rows = run(seed=4)
    bump = [r for r in rows if 0.40 <= r["progress"] < 0.50]
    for r in bump:
        if "eval_dropless/loss" in r:
            r["eval_dropless/loss"] *= 1.03
    res = check(doc, rows, None, now=0)
    ks = [a.kind for a in res.alerts if a.kind in ("above_band", "cleared")]
    assert ks[0] == "above_band" and ks[-1] == "cleared"
    cleared = [a for a in res.alerts if a.kind == "cleared"][-1]
    assert 0.5 <= cleared.fraction <= 0.53


def test_restart_with_state_repeats_no_alert(doc):
    rows = run("shift", at=0.3, seed=5)
    half = len(rows) // 2
    r1 = check(doc, rows[:half], None, now=0)
    st = json.loads(json.dumps(r1.state))  # the state is JSON-serialisable
    r2 = check(doc, rows[half:], st, now=1)
    full = check(doc, rows, None, now=0)
    assert kinds(r1.alerts) + kinds(r2.alerts) == kinds(full.alerts)
    # feeding nothing new after a restart raises nothing
    r3 = check(doc, [], r2.state, now=2)
    assert r3.alerts == []
    assert r3.exit_code == full.exit_code == 2


def test_nan_is_critical_at_once(doc):
    res = check(doc, run("nan", at=0.6, seed=6), None, now=0)
    nan = [a for a in res.alerts if a.kind == "nan"]
    assert nan and all(a.severity == "critical" for a in nan)
    assert {a.step for a in nan} == {int(round(0.6 * TARGET.steps))}
    assert res.exit_code == 2


def test_drop_fraction_jump_against_absolute_and_ladder_reference(doc):
    res = check(doc, run("drop", at=0.4, size=0.12, seed=7), None, now=0)
    drop = [a for a in res.alerts if a.kind == "drop_frac"]
    assert drop and drop[0].severity == "warn"
    onset = int(0.4 * TARGET.steps)
    assert onset <= drop[0].step <= onset + 20  # a trailing median of 20 rows
    # with a ladder reference of 3%, 12% is 4x: warn; 20% (> 5x) is critical
    ref = dict(doc)
    fr = np.linspace(0.005, 0.995, 100)
    ref["health_reference"] = {"fractions": fr.tolist(),
                               "signals": {"moe/drop_frac": {"median": [0.03] * 100}}}
    res2 = check(ref, run("drop", at=0.4, size=0.20, seed=7), None, now=0)
    drop2 = [a for a in res2.alerts if a.kind == "drop_frac"]
    assert [a.severity for a in drop2] == ["critical"]
    assert drop2[0].expected == pytest.approx(0.03)


def test_grad_norm_growth_past_four_warns():
    rows = run(seed=8)
    for r in rows:
        if r["progress"] >= 0.5:
            r["grad/norm"] = 0.3 * 5.0
    doc = make_prereg(LAW, TARGET, eval_noise=0.003)
    res = check(doc, rows, None, now=0)
    g = [a for a in res.alerts if a.kind == "grad_norm"]
    assert g and g[0].severity == "warn" and g[0].fraction >= 0.5


def test_spike_against_trailing_median():
    rows = run(seed=9)
    i = next(k for k, r in enumerate(rows) if r["progress"] >= 0.7)
    rows[i]["train/loss"] *= 1.5
    doc = make_prereg(LAW, TARGET, eval_noise=0.003)
    res = check(doc, rows, None, now=0)
    sp = [a for a in res.alerts if a.kind == "spike"]
    assert [a.step for a in sp] == [rows[i]["step"]]


def test_router_bias_judged_on_its_own_after_its_early_spike():
    rows = run(seed=10)  # synthetic router_bias starts 3x higher and decays: no alert
    doc = make_prereg(LAW, TARGET, eval_noise=0.003)
    assert not [a for a in check(doc, rows, None, now=0).alerts if a.kind == "router"]
    for r in rows:
        if r["progress"] >= 0.6:
            r["params/norm/router_bias"] *= 6
    res = check(doc, rows, None, now=0)
    rb = [a for a in res.alerts if a.kind == "router"]
    assert rb and rb[0].fraction >= 0.6


def test_contingency_advisory_numbers(doc):
    """Deviation +2% confirmed early: projected final = registered final x the smoothed ratio, and
    the budget is where the law's final (budget curve) x ratio crosses the registered final."""
    res = check(doc, run("shift", at=0.1, size=0.02, seed=11, offset=0.0), None, now=0)
    band = [a for a in res.alerts if a.kind == "above_band"][0]
    adv = [a for a in res.alerts if a.kind == "contingency"]
    assert len(adv) == 1 and adv[0].fraction <= 0.25
    ratio = band.value / band.expected
    assert adv[0].value == pytest.approx(doc["final"]["loss"] * ratio)
    m = np.array(doc["budget_curve"]["multiplier"])
    lo = np.array(doc["budget_curve"]["loss"]) * ratio
    need = np.interp(-doc["final"]["loss"], -lo, m)  # loss falls with budget
    assert adv[0].extra["budget_multiplier"] == pytest.approx(need, rel=1e-9)
    assert 1.0 < need < 4.0
    # the truth agrees: at that budget the true final x ratio is the registered final
    c = TARGET.compute * need
    assert float(TRUTH.loss(c, 1.0)) * ratio == pytest.approx(doc["final"]["loss"], rel=2e-3)
    # the shortened plans (decay re-aimed) are the law's finals at those budgets x the ratio
    k = list(m).index(0.6)
    assert f"0.6x -> {doc['budget_curve']['loss'][k] * ratio:.4f}" in adv[0].message


def test_late_deviation_gives_no_contingency(doc):
    res = check(doc, run("shift", at=0.6, seed=12), None, now=0)
    assert not [a for a in res.alerts if a.kind == "contingency"]


def test_not_applicable_from_config_and_from_progress(doc):
    cfg = {"config": {"rung": {"seq_len": TARGET.seq_len * 2, "steps": TARGET.steps}}}
    res = check(doc, [cfg] + run(seed=13), None, now=0)
    assert kinds(res.alerts) == [("not_applicable", "warn")]
    assert "seq_len" in res.alerts[0].message and res.exit_code == 3
    assert check(doc, run("shift", seed=1), res.state, now=1).alerts == []  # nothing compared
    # a shortened plan shows in step/progress: progress = step / (0.6 x steps)
    rows = run(seed=14)
    for r in rows:
        r["progress"] = r["step"] / (0.6 * TARGET.steps)
    res = check(doc, rows, None, now=0)
    assert res.exit_code == 3 and "planned steps" in res.state["not_applicable"]
    # matching config: applies
    ok = {"config": {"rung": {"seq_len": TARGET.seq_len, "steps": TARGET.steps}}}
    assert check(doc, [ok] + run(seed=1), None, now=0).exit_code == 0


def test_required_key_and_data_tag(doc):
    d = make_prereg(LAW, TARGET, eval_noise=0.003, data_tag="mix-a",
                    requires={"train.z_loss": 0.0001})
    bad = {"config": {"train": {"data_tag": "mix-b", "z_loss": 0.0001}}}
    res = check(d, [bad], None, now=0)
    assert res.exit_code == 3 and "data_tag" in res.state["not_applicable"]
    bad2 = {"config": {"train": {"data_tag": "mix-a", "z_loss": 0.0}}}
    assert "train.z_loss" in check(d, [bad2], None, now=0).state["not_applicable"]
    good = {"config": {"train": {"data_tag": "mix-a", "z_loss": 1e-4}}}
    assert check(d, [good], None, now=0).exit_code == 0


def test_stalled_after_the_configured_time(doc):
    res = check(doc, run(seed=1)[:100], None, now=1000.0)
    limit = WatchConfig().stalled_seconds
    assert check(doc, [], res.state, now=1000.0 + limit - 1).alerts == []
    st = check(doc, [], res.state, now=1000.0 + limit + 1)
    assert kinds(st.alerts) == [("stalled", "warn")]
    assert check(doc, [], st.state, now=1000.0 + 2 * limit).alerts == []  # once
    back = check(doc, run(seed=1)[100:110], st.state, now=1000.0 + 2 * limit)
    assert ("stalled", "info") in kinds(back.alerts)


def test_rewound_steps_last_one_wins_within_a_batch():
    rows = [{"step": s, "x": float(s)} for s in range(1, 11)]
    rows += [{"step": s, "x": -float(s)} for s in range(6, 9)]  # resumed at 5, crashed after 8
    b = Batch.from_rows(rows)
    assert b.step.tolist() == list(range(1, 11))
    x = dict(zip(b.step.tolist(), b.cols["x"].tolist(), strict=True))
    assert x[6] == -6.0 and x[8] == -8.0 and x[9] == 9.0 and len(b) == 10


def test_bad_values_are_notes_not_tracebacks(doc):
    rows = [{"step": 1, "train/loss": "oops", "grad/norm": "NaN"}, {"step": "x"},
            {"tokens": 5}, {"step": 2, "train/loss": None, "grad/norm": 1.0}]
    b = Batch.from_rows(rows)
    assert any("non-numeric" in n for n in b.notes) and any("step" in n for n in b.notes)
    assert b.nonfinite["grad/norm"].tolist() == [True, False]
    assert "train/loss" not in b.nonfinite  # a non-numeric value is not a NaN
    res = check(doc, rows, None, now=0)
    assert ("nan", "critical") in kinds(res.alerts)
    # steps 1-2 come before the target's first eval (step 12): no metric is due yet
    assert ("missing_metric", "info") not in kinds(res.alerts)


def test_the_missing_metric_note_waits_for_the_first_eval_due(doc):
    """Issue 38: 'wrong --metric?' appeared before the first eval was due. Rows before the
    target's first registered eval step say nothing; a row at or after it without the metric
    does, once."""
    first = min(TARGET.eval_steps)
    early = [{"step": s, "train/loss": 3.0} for s in range(1, first)]
    res = check(doc, early, None, now=0)
    assert ("missing_metric", "info") not in kinds(res.alerts)
    res = check(doc, [{"step": first, "train/loss": 3.0}], res.state, now=1)
    assert kinds(res.alerts).count(("missing_metric", "info")) == 1
    res = check(doc, [{"step": first + 1, "train/loss": 3.0}], res.state, now=2)
    assert ("missing_metric", "info") not in kinds(res.alerts)


def test_exit_codes():
    assert exit_code_for(None, False) == 0
    assert exit_code_for("info", False) == 0
    assert exit_code_for("warn", False) == 1
    assert exit_code_for("critical", False) == 2
    assert exit_code_for("critical", True) == 3


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="k_critical"):
        WatchConfig(k_consecutive=4, k_critical=2)
    with pytest.raises(ValueError, match="alert_level"):
        WatchConfig(alert_level=1.0)
    with pytest.raises(ValueError, match="bogus"):
        WatchConfig.from_dict({"bogus": 1})
    assert WatchConfig.from_dict(WatchConfig().to_dict()) == WatchConfig()
    assert math.isfinite(WatchConfig().stalled_seconds)


def test_trend_catches_a_step_inside_the_band(doc):
    """A run 1.2% below forecast (inside the band) that steps up 2% at 50% stays inside the alert
    band (+0.8%), but moved against its own earlier level: 'trend' within a few evals. The same
    run without the step raises nothing."""
    off = math.log(1 - 0.012)
    healthy = check(doc, run(seed=15, offset=off), None, now=0)
    assert [a for a in healthy.alerts if a.severity != "info"] == []
    res = check(doc, run("shift", at=0.5, size=0.02, seed=15, offset=off), None, now=0)
    assert not [a for a in res.alerts if a.kind == "above_band"]
    tr = [a for a in res.alerts if a.kind == "trend"]
    assert len(tr) == 1 and tr[0].direction == "worse" and tr[0].severity == "warn"
    assert 0.5 <= tr[0].fraction <= 0.55
    assert res.exit_code == 1


def test_registered_auto_precision_matches_what_the_run_resolved():
    from ladder.predict.watch import config_difference

    # preregister records the recipe ("auto": bf16 on accelerators, f32 on CPU); config.json of
    # the run records what ran: the forecast still applies
    assert config_difference({"model": {"precision": "auto"}}, {"model": {"precision": "f32"}}) \
        is None
    # a concrete registered value is held to it
    assert config_difference({"model": {"precision": "bf16"}}, {"model": {"precision": "f32"}}) \
        == "model.precision ('f32' in the run, 'bf16' registered)"


def test_config_split_by_concern():
    """WatchConfig is the loss, health and run families' fields, flat (what a pre-registration
    stores); no field belongs to two families, and each rule's slice validates its own."""
    import dataclasses

    from ladder.predict.watch import RULES, rule
    names = [{f.name for r in RULES if r.family == fam for f in dataclasses.fields(r.Config)}
             for fam in ("loss", "health", "run")]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    assert set.union(*names) == set(WatchConfig().to_dict())
    cfg = WatchConfig(k_consecutive=4, spike_k=9.0, stalled_seconds=60.0)
    band, spike, stalled = (rule(n) for n in ("band", "spike", "stalled"))
    assert band.config(cfg) == band.Config(k_consecutive=4)
    assert spike.config(cfg) == spike.Config(spike_k=9.0)
    assert stalled.config(cfg) == stalled.Config(stalled_seconds=60.0)
    assert spike.config(dataclasses.replace(cfg, spike_k=8.0)).spike_k == 8.0
    with pytest.raises(ValueError, match="spike_window: must be a positive integer"):
        spike.Config(spike_window=0)
    with pytest.raises(ValueError, match="align: must be auto"):
        WatchConfig(align="x")
