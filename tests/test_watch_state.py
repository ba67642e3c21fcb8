"""The watch rules as classes: WatchConfig and the state file derived from them, the one
hysteresis they share, and what was written before (a pre-registration's decision rule) read as
it was.

tests/data/decision_rule_main_7de5265.json: the
``decision_rule`` of two pre-registrations as main 7de5265 wrote them (default and tuned
thresholds), in the bytes ``ladder.predict.prereg.write_once`` writes.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ladder.cli.main import main as cli_main
from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.cli.predict import make_prereg
from ladder.predict.watch import (
    RULES,
    STATE_SCHEMA,
    WatchConfig,
    WatchState,
    check,
    check_state,
    new_state,
)
from ladder.predict.watch.rules.hysteresis import Hysteresis, level_changes

DATA = Path(__file__).parent / "data"
TRUTH = sy.Truth()
TARGET = sy.ladder_targets(4, steps0=150)[-1]
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)
NOISE = sy.RunNoise(run_sigma=0.005, eval_sigma=0.003)


@pytest.fixture(scope="module")
def doc():
    return make_prereg(LAW, TARGET, eval_noise=NOISE.eval_sigma, created="2026-01-01T00:00:00Z")


def _rows():
    """A 3% shift at 30%, grad norm x5 and a parameter group's norm x3 from 40%; it heals at
    60% (the raised alerts clear) and the loss jumps 5% at 80%
    (raised again)."""
    rows = sy.make_run(TRUTH, TARGET, noise=NOISE, fault=sy.Fault("shift", 0.3, 0.03),
                       seed=3).rows
    healthy = sy.make_run(TRUTH, TARGET, noise=NOISE, seed=3).rows
    for r, h in zip(rows, healthy, strict=True):
        if r["progress"] >= 0.4:
            r["grad/norm"] *= 5.0
            r["params/norm/blocks"] *= 3.0
        if r["progress"] >= 0.6:
            r.update({k: h[k] for k in ("eval_dropless/loss", "train/loss", "grad/norm")
                      if k in h})
        if r["progress"] >= 0.8 and "eval_dropless/loss" in r:
            r["eval_dropless/loss"] *= 1.05
    return rows


def _seen(alerts):
    return [(a.kind, a.severity, a.step, a.message) for a in alerts]


# ------------------------------------------------------------------ config


# rules added since 7de5265: each adds its own sentence to the words (and heading its thresholds)
NEW_RULES = ("heading", "router_logits")


def test_decision_rule_is_written_as_at_7de5265():
    """The thresholds moved into the rules' classes; a pre-registration's decision rule (its
    parameters in their order, its words) keeps its bytes, and an old one reads back."""
    tuned = WatchConfig(k_consecutive=4, spike_k=9.0, alert_level=0.95, nan_keys=("train/loss",),
                        align="step")
    got = {name: make_prereg(LAW, TARGET, eval_noise=0.003, created="2026-01-01T00:00:00Z",
                             config=cfg, level=0.8)["decision_rule"]
           for name, cfg in (("default", None), ("tuned", tuned))}
    # rules added since 7de5265 add their own slice of words and thresholds (rules/__init__.py);
    # the rest keeps its bytes
    from ladder.predict.watch import rule
    for name, cfg in (("default", None), ("tuned", tuned)):
        for new_rule in NEW_RULES:
            added = rule(new_rule).words(cfg or WatchConfig(), 0.8)
            assert added in got[name]["words"]
            got[name]["words"] = got[name]["words"].replace(" " + added, "")
        for k in HEADING_KEYS:  # its thresholds, at their defaults
            assert got[name]["parameters"].pop(k) == getattr(WatchConfig(), k)
    want = (DATA / "decision_rule_main_7de5265.json").read_text()
    assert json.dumps(got, indent=2) + "\n" == want
    old = json.loads(want)["tuned"]["parameters"]
    back = WatchConfig.from_dict(old).to_dict()
    assert WatchConfig.from_dict(old) == tuned and \
        {k: v for k, v in back.items() if k not in HEADING_KEYS} == old


HEADING_KEYS = ("heading_k", "heading_against", "heading_ahead", "heading_closing")


def test_watch_config_is_the_union_of_the_rules_thresholds():
    fields = {f.name: f.default for f in dataclasses.fields(WatchConfig)}
    declared = set()
    for r in RULES:
        for f in dataclasses.fields(r.Config):
            assert fields[f.name] == f.default, (r.name, f.name)  # one default per threshold
            declared.add(f.name)
    assert declared == set(fields)
    cfg = WatchConfig(k_clear=3, grad_window=7)
    band = next(r for r in RULES if r.name == "band")
    assert band.config(cfg).k_clear == 3 and not hasattr(band.config(cfg), "grad_window")
    with pytest.raises(ValueError, match="k_clear: must be a positive integer"):
        WatchConfig(k_clear=0)
    with pytest.raises(ValueError, match="k_critical: must be >= k_consecutive"):
        WatchConfig(k_consecutive=7)


# ------------------------------------------------------------------ the state file


def test_the_state_is_the_judges_fields_and_one_section_per_rule(doc):
    st = new_state()
    sections = {r.key for r in RULES if r.State is not None}
    assert st["schema"] == STATE_SCHEMA == "watch-state/2"
    assert set(st) == {"schema", "last_step", "last_point_time", "n_points", "n_evals", "worst",
                       "not_applicable"} | sections
    res = check(doc, _rows(), None, now=0)
    back = WatchState.read(json.loads(json.dumps(res.state)))
    assert back.to_json() == res.state  # every section to JSON and back


def test_a_watcher_restarted_on_its_state_goes_on_where_it_stopped(doc):
    """Restarted on the state it wrote at row 539 (the band critical, the trend and the
    grad-norm signal raised), the watcher raises what an uninterrupted watch raises after that
    point: nothing twice and nothing missed."""
    rows, cut = _rows(), 539
    full = check(doc, rows, None, now=0)
    saved = json.loads(json.dumps(check(doc, rows[:cut], None, now=0).state))
    assert saved["band"]["level"] == 2
    after = [a for a in full.alerts if a.step > saved["last_step"]]
    # the raised ones clear, and are raised again
    assert {(a.kind, a.extra.get("clears")) for a in after} >= {
        ("cleared", "above_band"), ("cleared", "trend"), ("cleared", "grad_norm"),
        ("above_band", None), ("rising", None)}
    again = check(doc, rows[cut:], saved, now=0)
    assert _seen(again.alerts) == _seen(after)
    assert again.state["n_evals"] == full.state["n_evals"]


def test_a_watch_state_1_file_is_refused_by_name(doc, tmp_path, capsys):
    """watch-state/1 was written only before any release (7de5265 and earlier): refused with
    the field named, never read as the current layout."""
    pre = tmp_path / "prereg.json"
    pr.write_once(pre, doc)
    src = tmp_path / "metrics.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rows()[:50]))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"schema": "watch-state/1", "prereg_sha256": doc["sha256"],
                                 "state": {"last_step": 3}, "seq": 0, "outbox": []}))
    code = cli_main(["watch", str(pre), "--source", str(src), "--state", str(state)])
    assert code >= 64 and "schema" in capsys.readouterr().err


@pytest.mark.parametrize("edit, field", [
    (lambda s: s["band"].__setitem__("run_len", -1), "state.band.run_len"),
    (lambda s: s["band"].__setitem__("about", "sideways"), "state.band.about"),
    (lambda s: s["grad_norm"]["signal"].__setitem__("level", 3), "state.grad_norm.signal.level"),
    (lambda s: s["param_norm"]["signals"].__setitem__("params/norm/x", []),
     "state.param_norm.signals.params/norm/x"),
    (lambda s: s["spike"].__setitem__("tail", [1.0, None]), "state.spike.tail"),
    (lambda s: s.__setitem__("signals", {}), "state.signals"),
    (lambda s: s.__setitem__("schema", "watch-state/9"), "state.schema"),
])
def test_a_damaged_v2_state_names_its_field(doc, edit, field):
    st = check(doc, _rows()[:600], None, now=0).state
    edit(st)
    with pytest.raises(ValueError) as e:
        check_state(st)
    assert str(e.value).startswith(field + ":")


# ------------------------------------------------------------------ the shared hysteresis


def test_hysteresis_raises_after_k_and_clears_after_k_clear():
    h = Hysteresis()
    sev = np.array([1, 1, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, -1, 0])
    got = [(i, ch.kind, ch.level_before) for i, ch in level_changes(h, sev, k_raise=3,
                                                                   k_clear=4)]
    # warn after 3 in a row (rows 3-5), critical after 3 more (6-8), cleared after 4 fine ones
    # (9-12, the unknown row 13 skipped, not counted)
    assert got == [(5, "raised", 0), (8, "raised", 1), (12, "cleared", 2)]
    assert (h.level, h.run, h.run_len) == (0, None, 5)
    h2 = Hysteresis(level=2)
    got = [(i, ch.kind) for i, ch in level_changes(h2, np.array([1, 1, 1]), k_raise=2,
                                                   k_clear=9)]
    assert got == [(1, "lowered")] and h2.level == 1  # critical down to warn


def test_band_hysteresis_is_per_direction():
    h = Hysteresis()
    h.extend("above")
    assert h.settle(1, about="above", k_clear=2).kind == "raised"
    h.extend("below")
    assert h.settle(1, about="below", k_clear=2).kind == "raised"  # the other side: raised anew
    h.extend("below")
    assert h.settle(1, about="below", k_clear=2) is None           # no change: no alert
    for _ in range(2):
        h.extend(None)
    ch = h.settle(0, k_clear=2)
    assert ch.kind == "cleared" and ch.about_before == "below" and h.about is None


@settings(max_examples=60, deadline=None)
@given(sev=hs.lists(hs.integers(-1, 2), min_size=1, max_size=120),
       cuts=hs.lists(hs.integers(0, 120), max_size=5),
       k_raise=hs.integers(1, 6), k_clear=hs.integers(1, 8))
def test_hysteresis_in_batches_is_one_pass_and_one_by_one(sev, cuts, k_raise, k_clear):
    """A signal judged in batches (its state through JSON between them: a restart) changes at
    the same rows as in one pass, and as observed one row at a time (how the loss rules use
    it)."""
    sev = np.array(sev)

    def changes(h, s):
        return [(i, ch.kind, h.level) for i, ch in level_changes(h, s, k_raise=k_raise,
                                                                 k_clear=k_clear)]
    whole = changes(Hysteresis(), sev)
    h, got, start = Hysteresis(), [], 0
    for end in sorted({c for c in cuts if 0 < c < len(sev)}) + [len(sev)]:
        got += [(i + start, k, lv) for i, k, lv in changes(h, sev[start:end])]
        h = Hysteresis.from_json(json.loads(json.dumps(h.to_json())), "h")
        start = end
    assert got == whole
    h, one = Hysteresis(), []
    for i, s in enumerate(sev):
        if s < 0:
            continue
        h.extend(int(s) or None)
        ch = h.settle(int(s), k_raise=k_raise, k_lower=k_raise, k_clear=k_clear)
        if ch:
            one.append((i, ch.kind, h.level))
    assert one == whole
