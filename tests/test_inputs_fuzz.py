"""Every command's inputs, broken: a one-line error (exit 64+) naming the file or the field, never
a traceback, a hang or exit 0 (issue 15). The named corpus of bench/fuzz_inputs.py (the slow
cases sampled) and a hypothesis search over numbers and JSON values where a user or a file gives
them; every command runs in-process (ladder.cli.main) under an alarm."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz_inputs import Case, build_world, corpus, judge, run_case
from ladder.specs import get_ladder

# Slow groups (a fit or a report each, 1-4 s): the issue's cases of them run here, all in the
# bench.
SLOW = ("fit runs line", "report runs line", "report target-run line")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("fuzz") / "world")


def _findings(results):
    return [f"{c.name}: {o.verdict} (exit {o.code}) {o.message[:200]}" for c, o in results
            if o.verdict not in ("error", "tolerated")]


# The failures issue 15 lists, each by the name of its corpus case.
ISSUE_CASES = (
    "fit --out prereg", "report tampered prereg", "watch tampered prereg",
    "predict --level '1.5'", "watch --poll '-1'", "watch --max-seconds 'nan'",
    "plan --devices '999999999999'", "run --lr '1e400'", "plan --peak-flops 'inf'",
    "watch --webhook http://", "watch corrupt .wandb", "fit all-NaN loss", "fit drops every row",
    "predict law uncertainty.level=1.5", "preregister law uncertainty.level=\"x\"",
    "predict law uncertainty.sigma_log=-0.1", "predict law fit.u.1=1e308",
    "preregister target schedule={\"kind\": \"no", "preregister target steps=1e30",
    "preregister target without eval_steps", "preregister target without batch",
    "verify beside deep", "watch beside bigint", "watch source line bigint",
    "watch source line deep", "fit runs line deep", "report runs line bigint",
    "preregister runs line deepobj", "predict law dir", "verify dir", "run config deep",
    "fit --out under-file", "preregister --out dir", "watch --alerts dir", "watch state junk",
    "watch state bigint", "fit csv bigint", "report --out under-file")


def test_corpus_gives_one_line_errors(world, tmp_path):
    """Every case of the issue's list, and every 10th of the other fast cases (the bench runs all
    of them: ``python bench/fuzz_inputs.py``)."""
    every = corpus()
    picked = [c for c in every if c.name.startswith(ISSUE_CASES)]
    for must in ISSUE_CASES:
        assert any(c.name.startswith(must) for c in picked), must
    rest = [c for c in every if c not in picked and not c.name.startswith(SLOW)]
    cases = picked + rest[::10]
    results = [(c, run_case(world, c, tmp_path)) for c in cases]
    assert len(results) > 60
    assert _findings(results) == []


# ------------------------------------------------------------------ hypothesis

def _raw_json():
    """JSON text of any value a file could hold where a number is expected."""
    scalars = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),  # NaN/Infinity tokens
        st.integers(min_value=-(10 ** 40), max_value=10 ** 40).map(str),
        st.sampled_from(["9" * 5000, "1e400", "-1e400", "1e-400", "[" * 50_000 + "]" * 50_000]),
        st.text(max_size=12).map(json.dumps), st.booleans().map(json.dumps), st.just("null"))
    nested = st.recursive(st.one_of(st.integers(-5, 5), st.floats(allow_nan=False),
                                    st.text(max_size=4)),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(
                              st.text(max_size=3), c, max_size=3), max_leaves=6).map(json.dumps)
    return st.one_of(scalars, nested)


def _value(raw: str):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _is_int_in(v, lo, hi) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) or
            isinstance(v, float) and v == v and v not in (float("inf"), float("-inf"))
            and v.is_integer()) and lo <= v <= hi


def _is_pos_finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and \
        abs(v) != float("inf") and v > 0


# (file, field, oracle: is the value acceptable?, command)
JSON_SLOTS = [
    ("target.json", "steps", lambda v: _is_int_in(v, 1, 2 ** 53), "preregister"),
    ("target.json", "tokens", _is_pos_finite, "preregister"),
    ("target.json", "batch", lambda v: v is None or _is_int_in(v, 1, 2 ** 53), "preregister"),
    ("target.json", "eval_steps", lambda v: isinstance(v, list) and all(
        _is_int_in(x, 0, get_ladder("tiny").target.steps) for x in v), "preregister"),
    ("law.json", "uncertainty.level",
     lambda v: _is_pos_finite(v) and 0 < v < 1, "predict"),
    ("law.json", "uncertainty.sigma_log",
     lambda v: v is None or isinstance(v, (int, float)) and not isinstance(v, bool) and
     v == v and 0 <= v < float("inf"), "predict"),
    ("law.json", "fit.u.1", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
     and v == v and abs(v) <= 700, "predict"),
]


def _argv(world_copy, file, command):
    if command == "predict":
        return ["predict", str(world_copy / "law.json"), "--compute", "1e20"]
    return ["preregister", str(world_copy / "law.json"), "--target-spec",
            str(world_copy / "target.json"), "--out", str(world_copy / "new.json")]


FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@FAST
@given(slot=st.sampled_from(JSON_SLOTS), raw=_raw_json())
def test_json_fields_never_crash_and_bad_values_fail(world, tmp_path, slot, raw):
    from bench.fuzz_inputs import _edit_json
    file, field, ok, command = slot

    def build(w):
        _edit_json(w / file, field, raw)
        return _argv(w, file, command)

    o = run_case(world, Case("h", build, (file, field.split(".")[-1]), bad=False), tmp_path)
    assert o.verdict in ("error", "tolerated"), (raw[:80], o)
    v = _value(raw)
    if not ok(v):
        assert o.code is not None and o.code >= 64, (field, raw[:80], o)


def _num_text():
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.integers(-(10 ** 30), 10 ** 30).map(str),
                     st.sampled_from(["1e400", "-0", "0x10", "", "nan", "9" * 400]))


def _float(t: str):
    try:
        return float(t)
    except (ValueError, OverflowError):
        return None


# (option, argv builder, oracle on the parsed float)
OPTION_SLOTS = [
    ("--level", lambda w, t: ["predict", str(w / "law.json"), "--compute", "1e20", "--level", t],
     lambda f: f is not None and 0 < f < 1),
    ("--fraction", lambda w, t: ["predict", str(w / "law.json"), "--compute", "1e20",
                                 "--fraction", t], lambda f: f is not None and 0 < f <= 1),
    ("--poll", lambda w, t: ["watch", str(w / "pre" / "prereg.json"), "--source",
                             str(w / "live.jsonl"), "--poll", t],
     lambda f: f is not None and 0 < f <= 3600),
    ("--max-seconds", lambda w, t: ["watch", str(w / "pre" / "prereg.json"), "--source",
                                    str(w / "live.jsonl"), "--max-seconds", t],
     lambda f: f is not None and 0 <= f < float("inf")),
    ("--mfu", lambda w, t: ["plan", "tiny", "--mfu", t], lambda f: f is not None and 0 < f <= 1),
    ("--eval-noise", lambda w, t: ["preregister", str(w / "law.json"), "--target-spec",
                                   str(w / "target.json"), "--eval-noise", t, "--out",
                                   str(w / "n.json")], lambda f: f is not None and 0 <= f <= 10),
]


@FAST
@given(slot=st.sampled_from(OPTION_SLOTS), text=_num_text())
def test_cli_numbers_never_crash_and_bad_values_fail(world, tmp_path, slot, text):
    name, argv_of, ok = slot
    o = run_case(world, Case("h", lambda w: argv_of(w, text), (name,), bad=False), tmp_path)
    assert o.verdict in ("error", "tolerated"), (name, text, o)
    if not ok(_float(text)):
        assert o.code is not None and o.code >= 64, (name, text, o)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(line=st.one_of(_raw_json(), st.binary(max_size=40).map(
    lambda b: b.decode("latin-1")), _raw_json().map(lambda r: '{"step": ' + r + "}")))
def test_any_metrics_line_is_tolerated_by_watch(world, tmp_path, line):
    def build(w):
        with open(w / "live.jsonl", "a", encoding="utf-8", errors="surrogateescape") as f:
            f.write(line.replace("\n", " ") + "\n")
        return ["watch", str(w / "pre" / "prereg.json"), "--source", str(w / "live.jsonl")]

    o = run_case(world, Case("h", build, bad=False), tmp_path)
    assert o.verdict in ("error", "tolerated"), (line[:80], o)
    assert o.code in (0, 1, 2, 3), (line[:80], o)  # a bad line is a note, not the end


def test_judge_tells_an_error_from_an_accepted_bad_input():
    """The harness itself can fail a case: exit 0 for an input called bad is 'accepted'."""
    assert judge(["list", "no-such-ladder"], ("no-such-ladder",)).verdict == "error"
    assert judge(["list", "tiny"]).verdict == "accepted"  # a good input judged as bad
