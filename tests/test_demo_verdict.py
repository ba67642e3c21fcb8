"""The demo's verdict follows the pre-registered decision rule, not the final point alone."""

from ladder.cli.demo import _verdict

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


# --- the exit status: the demo ran (0) unless --strict asks for the watch's status (issue 21) --

import argparse  # noqa: E402

import pytest  # noqa: E402

from ladder.cli import demo  # noqa: E402
from ladder.io import InputError  # noqa: E402


def _args(**kw):
    base = {"out": "unused", "ladder": "tiny", "inject": None, "inject_at": 0.5, "seed": 0,
            "strict": False}
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("watch_exit", [0, 1, 2, 3])
def test_demo_exits_0_when_it_ran_whatever_the_watch_found(monkeypatch, watch_exit):
    seen = {}

    def fake_run(out, ladder, **kw):
        seen.update(kw)
        return {"ok": watch_exit == 0, "watch_exit": watch_exit}

    monkeypatch.setattr(demo, "run_demo", fake_run)
    assert demo.demo_main(_args(seed=3)) == 0
    assert seen["seed"] == 3
    assert demo.demo_main(_args(strict=True)) == watch_exit


def test_a_negative_seed_is_a_usage_error():
    with pytest.raises(InputError) as e:
        demo.demo_main(_args(seed=-1))
    assert e.value.exit_code == 64 and "--seed" in str(e.value)


def test_the_seed_reaches_every_rung_and_the_target():
    assert demo.train_config(seed=7).seed == 7
    assert demo.train_config("lr-spike", 0.4, 7).seed == 7
