"""The demo's verdict follows the pre-registered decision rule, not the final point alone."""

from ladder.demo import _verdict

DOC = {"final": {"loss": 2.0, "lo": 1.9, "hi": 2.2}, "metric": "eval_dropless/loss",
       "target": {"name": "hero"}, "created": "2026-12-01", "band_level": 0.9}


def _summary(final):
    return {"final": {"eval_dropless/loss": final}}


def test_inside_without_alerts_is_on_track():
    v = _verdict(DOC, _summary(2.05), [])
    assert v["ok"] and v["inside"] and v["lines"][-1].endswith("on track: no warning")


def test_outside_the_90_band_without_any_warning_is_not_a_deviation():
    # a healthy run ends outside its 90% band one time in ten; the alerts (99% band,
    # hysteresis) decide
    v = _verdict(DOC, _summary(1.85), [{"severity": "info", "kind": "contingency"}])
    assert v["ok"] and not v["inside"]
    assert "outside the 90% band, as 10% of healthy runs do" in v["lines"][-1]


def test_a_warning_is_a_deviation_inside_the_band_or_not():
    warn = [{"severity": "warn", "kind": "rising"}]
    for final in (2.05, 1.85):
        v = _verdict(DOC, _summary(final), warn)
        assert not v["ok"] and "deviated" in v["lines"][-1] and "rising" in v["lines"][-2]


def test_no_final_value_is_a_deviation():
    assert not _verdict(DOC, {"final": {}}, [])["ok"]
