"""Every command's inputs, broken: a one-line error (exit 64+) naming the file or the field, never
a traceback, a hang or exit 0 (issue 15). The named corpus of bench/fuzz_inputs.py (the slow
cases sampled) and a hypothesis search over numbers and JSON values where a user or a file gives
them; every command runs in-process (ladder.cli.main.main) under an alarm."""

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


@pytest.mark.heavy  # 27 s on 2 busy cores
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


@pytest.mark.heavy  # 8 s on 2 busy cores
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


@pytest.mark.heavy  # 5 s on 2 busy cores
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


# ------------------------------------------------------------------ issue 26: the battery

# One case of each surface in the default suite (each well under a few seconds); the whole
# battery, rungs trained and W&B included, in the slow set.
ISSUE26_CASES = (
    "list rung name with a NUL", "verify amends.path outside the folder", "watch --state FIFO",
    "watch --source /dev/zero", "predict law 600 MB", "verify with a FIFO beside",
    "watch follows a hand-sealed amendment dated 9999", 'watch state state.worst="bogus"',
    "watch state outbox nested pending", "list --ladder-file n_layers=10**7",
    "watch --alerts after a partial last line", "watch --webhook-file")


def test_issue26_cases_of_every_surface(world, tmp_path):
    from bench.fuzz_inputs import corpus26
    cases = [c for c in corpus26() if c.name in ISSUE26_CASES]
    assert len(cases) == len(ISSUE26_CASES)
    assert len({c.surface for c in cases}) >= 6
    results = [(c, run_case(world, c, tmp_path)) for c in cases]
    assert _findings(results) == []


@pytest.mark.slow  # ~70 cases, 7 of them train a rung or open a W&B run: minutes
def test_issue26_battery_has_no_finding(world, tmp_path):
    from bench.fuzz_inputs import corpus26, preload, surface_table
    preload()
    results = [(c, run_case(world, c, tmp_path)) for c in corpus26()]
    print(surface_table(results))
    assert _findings(results) == []


@pytest.mark.slow  # 31 cases, 5 of them train a rung: minutes (tests/test_inputs_writers.py
# holds each example of issue 39 in the default suite)
def test_issue39_writer_battery_has_no_finding(world, tmp_path):
    from bench.fuzz_inputs import corpus39_writers, preload, surface_table
    preload()
    results = [(c, run_case(world, c, tmp_path)) for c in corpus39_writers()]
    print(surface_table(results))
    assert len({c.surface for c, _ in results}) == 4
    assert _findings(results) == []


# ------------------------------------------------------------------ hypothesis: the file readers

READERS = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


def _json_values():
    return st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(10 ** 30), 10 ** 30),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8)),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                            max_size=3), max_leaves=8)


def _mutate(doc, path_value):
    """``doc`` with the value at a path of keys/indexes replaced (the path is cut where the
    document has nothing to descend into)."""
    path, value = path_value
    cur = doc
    for i, step in enumerate(path):
        if isinstance(cur, dict) and cur:
            key = sorted(cur)[step % len(cur)]
            if i == len(path) - 1 or not isinstance(cur[key], (dict, list)):
                cur[key] = value
                return doc
            cur = cur[key]
        elif isinstance(cur, list) and cur:
            j = step % len(cur)
            if i == len(path) - 1 or not isinstance(cur[j], (dict, list)):
                cur[j] = value
                return doc
            cur = cur[j]
        else:
            return doc
    return doc


MUTATION = st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=4), _json_values())


@pytest.mark.slow
@READERS
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_any_state_file_is_taken_or_refused_with_one_line(world, tmp_path, mutations):
    from bench.fuzz_inputs import _state_of

    def build(w):
        st_path = _state_of(w)
        doc = json.loads(st_path.read_text())
        for m in mutations:
            doc = _mutate(doc, m)
        st_path.write_text(json.dumps(doc))
        return ["watch", str(w / "pre" / "prereg.json"), "--source", str(w / "live.jsonl"),
                "--state", str(st_path)]

    o = run_case(world, Case("h", build, bad=False), tmp_path)
    assert o.verdict in ("error", "tolerated"), (mutations, o)
    assert o.code in (0, 1, 2, 3) or o.code >= 64, (mutations, o)


@pytest.mark.slow
@READERS
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_any_token_manifest_is_loaded_or_refused_with_one_line(world, tmp_path, mutations):
    import shutil

    from ladder.io import InputError
    from ladder.trainer.tokens import load_shards
    d = tmp_path / "shards"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(world / "shards", d)
    doc = json.loads((d / "manifest.json").read_text())
    for m in mutations:
        doc = _mutate(doc, m)
    (d / "manifest.json").write_text(json.dumps(doc))
    try:
        shards = load_shards(d)
    except InputError as e:
        assert "\n" not in str(e) and e.exit_code >= 64
        return
    assert shards.vocab_size >= 1  # taken: every field it reads was in range


@pytest.mark.slow
@READERS
@given(value=_json_values(), field_=st.sampled_from(
    ["vocab_size", "seq_len", "head_dim", "n_experts", "top_k", "n_shared", "tokens_per_active",
     "batch_per_unit", "lr_coef", "lr_tokens_exp", "local_window", "eval_every",
     "capacity_factor", "route_scale", "qk_mult", "conv_kernel"]),
    where=st.sampled_from(["recipe", "rungs", "target"]))
def test_any_ladder_file_number_is_taken_or_refused_with_one_line(tmp_path, value, field_,
                                                                   where):
    from importlib.resources import files

    import tomllib

    from ladder.io import InputError
    from ladder.specs import load_ladder_file, parse_ladder
    doc = tomllib.loads((files("ladder") / "ladders" / "tiny.toml").read_text())
    if where == "recipe":
        doc["recipe"][field_] = value
    else:
        table = doc["target"] if where == "target" else doc["rungs"][0]
        table[{"vocab_size": "d", "seq_len": "n_layers"}.get(field_, "batch_units")] = value
    p = tmp_path / "lad.json"
    p.write_text(json.dumps(doc))
    try:
        lad = load_ladder_file(p)
    except InputError as e:
        assert "\n" not in str(e) and e.exit_code == 65 and e.field
        return
    for r in lad.all:  # taken: a rung any machine could hold
        assert 1 <= r.steps <= 10 ** 12 and r.summary()["compute"] > 0
    del parse_ladder


@pytest.mark.slow
@READERS
@given(data=st.binary(max_size=300) | st.lists(_json_values(), max_size=4).map(
    lambda xs: "\n".join(json.dumps(x) for x in xs).encode()))
def test_any_bytes_in_a_file_reader_is_a_value_or_one_line(tmp_path, data):
    from ladder.io import InputError, iter_jsonl, read_json
    from ladder.predict.prereg import read_chain_file
    p = tmp_path / "x.json"
    p.write_bytes(data)
    for reader in (read_json, read_chain_file, lambda q: list(iter_jsonl(q))):
        try:
            reader(p)
        except InputError as e:
            assert "\n" not in str(e)
