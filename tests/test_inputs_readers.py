"""Issue 39, the readers' half: every field a reader uses is checked (one line naming the file and
the field), a restarted watcher never judges a step twice whatever its source, readers keep
bounded memory, and the live page answers its own clients under slow ones.

Each example of the issue is one test here that fails on 2c68a70 (the code before) and passes
now; the hypothesis tests cover each class (law fields, state and progress files, key maps,
compare files, W&B record logs). bench/fuzz_readers.py prints the table per class.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import KNOWN_LAW, run_cli, write_law_runs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.fuzz_inputs import address_space_cap
from bench.fuzz_readers import history_records as _history
from bench.fuzz_readers import write_wandb_log as _wandb_log
from ladder.io import InputError

FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


# ----------------------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A tiny ladder's runs, its fitted law.json, a target spec, the target's pre-registration
    and its healthy run as metrics rows (live.jsonl): built once (~3 s, mostly the fit)."""
    from ladder.predict.forecast import Target

    root = tmp_path_factory.mktemp("readers")
    E, A, alpha = KNOWN_LAW
    lad = write_law_runs(root / "runs")
    # form auto: the tiny ladder's 3 runs give a compute law with a band (a named --form is
    # the textbook estimator since issue 35: 3 points, 3 parameters, no residual dof)
    code, _, err = run_cli("fit", root / "runs", "--form", "auto", "--bootstrap", "20",
                           "--out", root / "law.json")
    assert code == 0, err
    target = Target.from_rung(lad.target)
    (root / "target.json").write_text(json.dumps(target.to_dict()))
    code, _, err = run_cli("preregister", root / "law.json", "--target-spec",
                           root / "target.json", "--out", root / "pre" / "prereg.json",
                           "--eval-noise", "0.003")
    assert code == 0, err
    t = lad.target
    rows = []
    for step in t.eval_steps():
        tokens = step * t.tokens_per_step
        rows.append({"step": step, "tokens": tokens, "progress": step / t.steps, "time": 0.0,
                     "eval_dropless/loss": E + A * t.compute(tokens) ** -alpha,
                     "train/loss": 2.0})
    (root / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _law(world) -> dict:
    return json.loads((world / "law.json").read_text())


def _set(doc: dict, dotted: str, value) -> dict:
    doc = copy.deepcopy(doc)
    node, parts = doc, dotted.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value
    return doc


def _one_line(code: int, err: str, *names: str) -> None:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code >= 64, (code, err)
    assert "Traceback" not in err and len(lines) == 1, err
    assert all(n in lines[0] for n in names), (names, lines[0])


def _predict(world, doc: dict, tmp_path) -> tuple[int, str, str]:
    p = tmp_path / "edited_law.json"
    p.write_text(json.dumps(doc))
    return run_cli("predict", p, "--compute", "1e13")


# ------------------------------------------------------------ class 1: law.json fields


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_a_malformed_extrapolation_record_is_refused_not_read_as_no_term(world, tmp_path):
    """Was: exit 0 with the extrapolation term dropped (the band 8x narrower out of range)."""
    doc = _set(_law(world), "diagnostics.backtest.extrapolation.ranges_log10", [8.8, 9.8])
    code, out, err = _predict(world, doc, tmp_path)
    _one_line(code, err, "edited_law.json", "diagnostics.backtest.extrapolation.ranges_log10")


@pytest.mark.parametrize("field,value", [("uncertainty.sigma_log", 1e300),
                                         ("uncertainty.dof", 0),
                                         ("diagnostics.backtest.extrapolation.rate_per_decade",
                                          1e300)])
def test_a_spread_that_gives_an_infinity_or_nan_band_is_refused(world, tmp_path, field, value):
    """Was: `predict` printed an Infinity (sigma_log, the rate) or NaN (dof 0) band, exit 0."""
    code, out, err = _predict(world, _set(_law(world), field, value), tmp_path)
    _one_line(code, err, "edited_law.json", field)


@pytest.mark.parametrize("field,value", [("diagnostics.backtest.folds", 5),
                                         ("diagnostics.backtest.folds.0.final_rel_err", 7)])
def test_the_law_1_upgrade_checks_the_fields_it_reads(field, value, tmp_path):
    """Was: a TypeError from the law/1 upgrade (it iterated the folds unchecked)."""
    src = Path(__file__).parent / "data" / "law_main_b81488e.json"
    doc = _set(json.loads(src.read_text()), field, value)
    p = tmp_path / "old_law.json"
    p.write_text(json.dumps(doc))
    code, _, err = run_cli("predict", p, "--compute", "1e22")
    _one_line(code, err, "old_law.json", field.replace(".0.", "[0]."))


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**30, 10**30)
                     | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=4),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c,
                                                                         max_size=3),
                     max_leaves=6)


def _paths(doc, prefix="") -> list[str]:
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if "." in k:
                continue
            out.append(prefix + k)
            out += _paths(v, prefix + k + ".")
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out.append(f"{prefix}{i}")
            out += _paths(v, f"{prefix}{i}.")
    return out


@FAST
@given(data=st.data(), old=st.booleans())
def test_any_field_of_a_law_edited_is_read_or_refused_and_no_band_is_infinite(world, tmp_path,
                                                                              data, old):
    """Property: a law.json (law/3, or law/1 through its upgrade) with any field replaced by any
    JSON value predicts a finite loss and a band that is finite or missing (NaN, said), or is
    refused by an InputError; never another exception, never an Infinity band."""
    from ladder.fit.law import law_from_json
    doc = json.loads((Path(__file__).parent / "data" / "law_main_b81488e.json").read_text()) \
        if old else _law(world)
    where = data.draw(st.sampled_from(_paths(doc)))
    doc = _set(doc, where, data.draw(_JSON))
    with np.errstate(all="ignore"):
        try:
            law = law_from_json(doc, path="law.json")
            pred = law.predict(compute=1e13 if not old else 1e22, level=0.9)
        except InputError:
            return
    for k in ("lo", "hi"):
        assert not np.any(np.isinf(np.asarray(getattr(pred, k), float))), (where, k)


# Every field, each of these values: the property test above draws a few at random (and on one
# machine found an object read as a mapping unchecked); this sweep asks each field every time.
_SWEEP = [None, True, 0, -1, 1e308, -1e308, float("nan"), float("inf"), "x", "", [], {}, [1, 2],
          {"a": 1}, [[1]], ["a", "b"], 10**30]


@pytest.mark.heavy  # ~10 s: 2 laws x ~80 fields x 17 values
def test_every_field_of_a_law_set_to_each_kind_of_value_is_read_or_refused(world):
    """Was: an AttributeError for fit.prior, fit.spec.fix or uncertainty.intervals not an object,
    and an Infinity band for an extrapolation power or scale of 1e308."""
    from ladder.fit.law import law_from_json
    bad = []
    for old in (False, True):
        base = json.loads((Path(__file__).parent / "data" / "law_main_b81488e.json").read_text()) \
            if old else _law(world)
        for where in _paths(base):
            for v in _SWEEP:
                doc = _set(copy.deepcopy(base), where, v)
                try:
                    with np.errstate(all="ignore"):
                        pred = law_from_json(doc, path="law.json").predict(
                            compute=1e22 if old else 1e13, level=0.9)
                except InputError:
                    continue
                except Exception as e:  # noqa: BLE001 - the sweep lists every other exception
                    bad.append((old, where, v, f"{type(e).__name__}: {e}"))
                    continue
                if any(np.any(np.isinf(np.asarray(getattr(pred, k), float))) for k in ("lo", "hi")):
                    bad.append((old, where, v, "an Infinity band"))
    assert not bad, bad[:10]


@pytest.mark.heavy  # ~10 s
def test_every_registered_number_set_to_each_kind_of_value_is_judged_or_refused(world, tmp_path):
    """Was: a resealed final.lo of 0 or below stopped the watch with a ZeroDivisionError or a
    math domain error in the updated forecast's prior (it reads the final band in log)."""
    from ladder.predict import prereg as pr
    base = json.loads((world / "pre" / "prereg.json").read_text())
    bad = []
    for where in [w for w in _paths(base) if w.startswith(
            ("forecast.", "final", "eval_noise", "band_level", "target.steps", "target.tokens"))]:
        for v in _SWEEP:
            p = tmp_path / "resealed.json"
            p.write_text(json.dumps(pr.seal(_set(copy.deepcopy(base), where, v))))
            try:
                code, _, err = run_cli("watch", p, "--source", world / "live.jsonl")
            except Exception as e:  # noqa: BLE001
                bad.append((where, v, f"{type(e).__name__}: {e}"))
                continue
            last = err.strip().splitlines()[-1] if err.strip() else ""
            if "Traceback" in err or not (code in (0, 1, 2, 3) or code >= 64 and "field '" in last):
                bad.append((where, v, code, last))
    assert not bad, bad[:10]


# ------------------------------------------------ class 2: state, progress, key maps, compare


def test_a_state_file_of_a_future_schema_is_refused_by_name(world, tmp_path):
    """Was: a watch-state/3 file read as the current one."""
    state = tmp_path / "state.json"
    code, _, err = run_cli("watch", world / "pre" / "prereg.json", "--source",
                           world / "live.jsonl", "--state", state)
    assert code == 0, err
    doc = json.loads(state.read_text())
    doc["schema"] = "watch-state/3"
    state.write_text(json.dumps(doc))
    code, _, err = run_cli("watch", world / "pre" / "prereg.json", "--source",
                           world / "live.jsonl", "--state", state)
    _one_line(code, err, "state.json", "watch-state/3")


@pytest.mark.parametrize("name", ["summary.json", "config.json"])
def test_a_run_file_of_a_later_schema_is_refused_by_name(tmp_path, name):
    """Was: a run-summary/2 or run-config/2 file (a later ladder's) read as version 1."""
    lad = write_law_runs(tmp_path / "runs")
    f = tmp_path / "runs" / lad.name / lad.rungs[1].name / name
    doc = json.loads(f.read_text())
    doc["schema"] = doc["schema"].replace("/1", "/2")
    f.write_text(json.dumps(doc))
    code, _, err = run_cli("fit", tmp_path / "runs", "--bootstrap", "0",
                           "--out", tmp_path / "law.json")
    _one_line(code, err, str(f), "field 'schema'", doc["schema"], "newer")
    assert not (tmp_path / "law.json").exists()
    from ladder.sources.runs import read_run
    with pytest.raises(InputError, match="field 'schema'"):
        read_run(f.parent)


@FAST
@given(name=st.sampled_from(["summary.json", "config.json"]),
       schema=st.one_of(_JSON, st.from_regex(r"\Arun-(summary|config)/[0-9]{1,7}\Z")))
@example(name="summary.json", schema="run-summary/1")
@example(name="config.json", schema="run-config/1")
@example(name="summary.json", schema="run-summary/2")
def test_any_schema_of_a_run_file_is_read_as_version_1_only_when_it_says_so(tmp_path_factory,
                                                                           name, schema):
    """Property: a run's summary.json or config.json is read when its schema is the version
    this reader knows, and refused in one line naming the file and 'schema' otherwise."""
    from ladder.sources.runs import read_run
    root = tmp_path_factory.mktemp("runs")
    lad = write_law_runs(root)
    f = root / lad.name / lad.rungs[0].name / name
    doc = json.loads(f.read_text())
    known = doc["schema"]
    doc["schema"] = schema
    f.write_text(json.dumps(doc))
    if schema == known:
        assert read_run(f.parent).path == f.parent
        return
    with pytest.raises(InputError) as e:
        read_run(f.parent)
    assert e.value.field == "schema" and e.value.path == str(f)
    assert len(str(e.value).splitlines()) == 1


@pytest.fixture(scope="module")
def saved_state(world, tmp_path_factory) -> dict:
    """The state file of a watch of the healthy run (``--state``), as written."""
    state = tmp_path_factory.mktemp("state") / "state.json"
    code, _, err = run_cli("watch", world / "pre" / "prereg.json", "--source",
                           world / "live.jsonl", "--state", state)
    assert code == 0, err
    return json.loads(state.read_text())


@FAST
@given(data=st.data())
def test_any_field_of_a_state_file_edited_is_read_or_refused_in_one_line(world, saved_state,
                                                                         tmp_path_factory,
                                                                         data):
    """Property: a state file with any field replaced by any JSON value is continued from, or
    refused with one line naming the file (exit 64+); never a traceback."""
    where = data.draw(st.sampled_from(_paths(saved_state)))
    doc = _set(saved_state, where, data.draw(_JSON))
    state = tmp_path_factory.mktemp("st") / "state.json"
    state.write_text(json.dumps(doc))
    code, _, err = run_cli("watch", world / "pre" / "prereg.json", "--source",
                           world / "live.jsonl", "--state", state)
    assert "Traceback" not in err, (where, err)
    if code >= 64:
        _one_line(code, err, "state.json")


@FAST
@given(pos=st.dictionaries(st.sampled_from(["kind", "segments", "config_sent", "path"]), _JSON,
                           max_size=4),
       segs=st.dictionaries(st.text(max_size=6), _JSON, max_size=3))
def test_any_saved_wandb_position_is_taken_or_refused_naming_its_field(tmp_path_factory, pos,
                                                                       segs):
    """Property: a W&B offline source restored from any saved position continues (True),
    starts over (False) or raises a ValueError naming ``source.FIELD`` (the watcher's one
    line); its polls then work."""
    from ladder.sources import WandbOfflineSource
    d = tmp_path_factory.mktemp("wbpos")
    _wandb_log(d / "run-20261201_080000-abc" / "run-abc.wandb",
               _history([{"step": 1, "train/loss": 2.0}]))
    src = WandbOfflineSource(d)
    pos = {**pos, "kind": "wandb-offline", "segments": segs} if segs else pos
    try:
        got = src.restore(pos)
    except ValueError as e:
        assert str(e).startswith("source.")
        return
    assert got in (True, False)
    src.poll()


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    root = tmp_path_factory.mktemp("tokenizer")
    words = "alpha beta gamma delta ladder expert router token".split()
    rng = np.random.default_rng(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(rng.choice(words, size=30)) for _ in range(20)],
                            trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                                show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(root / "tokenizer.json"))
    return root / "tokenizer.json"


class _Crash(Exception):
    pass


def _interrupted_tokenize(tmp_path, tok_path, monkeypatch) -> tuple[Path, Path]:
    """A tokenize run that died mid-way: (its input, its --out with progress.json)."""
    from ladder.trainer import tokens as T
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": f"alpha beta gamma {i} " * 5}) + "\n"
                           for i in range(80)))
    out = tmp_path / "out"
    real, n = T._SplitWriter.append, {"n": 0}

    def append(self, *a):
        n["n"] += 1
        real(self, *a)
        if n["n"] == 4:
            raise _Crash
    with monkeypatch.context() as mp:
        mp.setattr(T._SplitWriter, "append", append)
        with pytest.raises(_Crash):
            T.tokenize_files([str(src)], tok_path, out, shard_tokens=300, chunk_chars=500)
    assert (out / T.PROGRESS).exists()
    return src, out


def test_a_progress_position_of_the_wrong_type_is_one_line(tmp_path, tok_path, monkeypatch):
    """Was: a TypeError resuming a tokenize whose progress.json position is not a list."""
    from ladder.trainer import tokens as T
    src, out = _interrupted_tokenize(tmp_path, tok_path, monkeypatch)
    prog = json.loads((out / T.PROGRESS).read_text())
    prog["position"] = "0"
    (out / T.PROGRESS).write_text(json.dumps(prog))
    with pytest.raises(InputError, match=r"progress.json: field 'position'"):
        T.tokenize_files([str(src)], tok_path, out, shard_tokens=300, chunk_chars=500)


@FAST
@given(data=st.data())
def test_any_field_of_a_progress_file_edited_is_checked_or_resumed(tmp_path_factory, data):
    """Property: a progress.json with any field replaced passes the check only with the types
    and ranges the resume reads (no TypeError, KeyError or IndexError after it)."""
    from ladder.trainer import tokens as T
    prog = {"schema": T.PROGRESS_SCHEMA, "phase": "reading", "settings": {}, "inputs": [],
            "position": [0, 120, 3],
            "splits": {s: {"shards": [{"file": f"{s}-00000.bin", "tokens": 300}],
                           "open_tokens": 5, "open_documents": 1, "documents": 3,
                           "text_bytes": 90} for s in T.SPLITS}}
    where = data.draw(st.sampled_from(_paths(prog)))
    prog = _set(prog, where, data.draw(_JSON))
    try:
        got = T.check_progress(prog, Path("progress.json"), 1)
    except InputError as e:
        assert "progress.json" in str(e)
        return
    # what the resume reads, read as it reads it
    tuple(got["position"])[0] + 1
    for s in T.SPLITS:
        sum(sh["tokens"] for sh in got["splits"][s]["shards"]) + got["splits"][s]["open_tokens"]


def test_a_resealed_family_alert_level_of_7_5_is_refused(tmp_path):
    """Was: a prereg/3 whose decision_rule.family.family_alert_level is 7.5 (resealed, so its
    sha256 holds) watched as if valid."""
    from ladder.predict import prereg as pr
    import synthetic as sy
    from ladder.predict.watch import WatchConfig
    from ladder.predict.watch.multi import family_config
    target = sy.ladder_targets(3, steps0=60)[-1]
    cfg, family = family_config(WatchConfig(), 2)
    docs = {k: pr.make_prereg(sy.TruthLaw(sy.Truth(), metric=k), target, eval_noise=0.003,
                              config=cfg) for k in ("a/loss", "b/loss")}
    doc = pr.build_multi(docs, family=family)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    pr.load(good)  # the file as written is read
    doc["decision_rule"]["family"]["family_alert_level"] = 7.5
    bad = tmp_path / "resealed.json"
    bad.write_text(json.dumps(pr.seal(doc)))
    (tmp_path / "m.jsonl").write_text(json.dumps({"step": 1, "a/loss": 3.0}) + "\n")
    code, _, err = run_cli("watch", bad, "--source", tmp_path / "m.jsonl")
    _one_line(code, err, "resealed.json", "decision_rule.family.family_alert_level")


@pytest.mark.parametrize("field,value", [("forecast.5.lo", 99.0), ("forecast.5.hi", "Infinity"),
                                         ("final.loss", "NaN"), ("eval_noise.sigma", -1),
                                         ("target.steps", -5), ("band_level", 7.5)])
def test_a_resealed_prereg_with_a_number_out_of_range_is_one_line(world, tmp_path, field, value):
    """Was: watched with exit 0 (an inverted or infinite band, a NaN final, a negative eval
    noise, a negative run length), or a misleading line (band_level 7.5)."""
    from ladder.predict import prereg as pr
    doc = _set(json.loads((world / "pre" / "prereg.json").read_text()), field, value)
    p = tmp_path / "resealed.json"
    p.write_text(json.dumps(pr.seal(doc)))
    code, _, err = run_cli("watch", p, "--source", world / "live.jsonl")
    name = field.replace(".5.", "[5].")
    _one_line(code, err, "resealed.json", name)


@pytest.mark.parametrize("scale", [0.1, 1e-4, 1e25])
def test_a_resealed_target_tokens_that_misplaces_every_eval_names_target_tokens(world,
                                                                               tmp_path,
                                                                               scale):
    """Was: '0 evals judged ... name the source key with --metric' (field '--metric'), though
    the source holds the key: every eval fell outside the run the resealed target.tokens says."""
    from ladder.predict import prereg as pr
    doc = json.loads((world / "pre" / "prereg.json").read_text())
    doc = _set(doc, "target.tokens", doc["target"]["tokens"] * scale)
    p = tmp_path / "resealed.json"
    p.write_text(json.dumps(pr.seal(doc)))
    code, _, err = run_cli("watch", p, "--source", world / "live.jsonl")
    _one_line(code, err.strip().splitlines()[-1], "resealed.json", "field 'target.tokens'",
              "0 of 4 evals")
    assert code == 65 and "--metric" not in err
    # a key the source lacks is still the --metric line
    code, _, err = run_cli("watch", world / "pre" / "prereg.json", "--source",
                           world / "live.jsonl", "--metric", "eval/none")
    assert code == 65 and "field '--metric'" in err.strip().splitlines()[-1]


@FAST
@given(data=st.data())
def test_any_registered_number_resealed_is_judged_sanely_or_refused(world, tmp_path_factory,
                                                                   data):
    """Property: a pre-registration with a forecast point, its final, its eval noise or its
    target's size replaced by any value (and resealed) is refused with one line, or watched
    with a verdict (exit 0-3); never a traceback."""
    from ladder.predict import prereg as pr
    doc = json.loads((world / "pre" / "prereg.json").read_text())
    where = data.draw(st.sampled_from(
        [w for w in _paths(doc) if w.startswith(("forecast.", "final", "eval_noise", "band_level",
                                                 "target.steps", "target.tokens"))]))
    doc = _set(doc, where, data.draw(_JSON))
    p = tmp_path_factory.mktemp("pre") / "resealed.json"
    p.write_text(json.dumps(pr.seal(doc)))
    code, _, err = run_cli("watch", p, "--source", world / "live.jsonl")
    assert "Traceback" not in err, (where, err)
    # a refusal is the last line (the watch says what it follows and read before it)
    assert code in (0, 1, 2, 3) or code >= 64 and "field '" in err.strip().splitlines()[-1], \
        (where, code, err)


def test_a_compare_interval_that_excludes_its_own_estimate_is_refused(tmp_path):
    """Was: [2.0, 3.0] around a multiplier of 1.5 silently widened to [1.5, 3.0] and used."""
    from ladder.predict.amend import multiplier_from_compare
    p = tmp_path / "compare.json"
    p.write_text(json.dumps({"loss": {"multiplier": 1.5, "lo": 2.0, "hi": 3.0, "level": 0.9}}))
    with pytest.raises(InputError, match=r"compare.json: field 'loss.lo'.*excludes"):
        multiplier_from_compare(str(p), "loss")
    # the same entry in the compare.json that `ladder compare --out` writes: read alike
    p.write_text(json.dumps({"schema": "compare/1", "a": "A", "b": "B", "metrics": {
        "loss": {"multiplier": 1.5, "lo": 1.2, "hi": 3.0, "level": 0.9}}}))
    got = multiplier_from_compare(str(p), "loss")
    assert (got.value, got.lo, got.hi, got.level) == (1.5, 1.2, 3.0, 0.9)


@FAST
@given(m=_JSON, lo=_JSON, hi=_JSON, level=_JSON)
def test_any_compare_entry_gives_a_multiplier_inside_its_interval_or_one_line(tmp_path_factory,
                                                                              m, lo, hi, level):
    from ladder.predict.amend import multiplier_from_compare
    p = tmp_path_factory.mktemp("cmp") / "compare.json"
    p.write_text(json.dumps({"loss": {"multiplier": m, "lo": lo, "hi": hi, "level": level}}))
    try:
        got = multiplier_from_compare(str(p), "loss")
    except InputError as e:
        assert "compare.json" in str(e) and "\n" not in str(e)
        return
    assert 0 < got.lo <= got.value <= got.hi < math.inf
    assert got.level is None or 0 < got.level < 1


def test_a_keymap_scale_that_makes_every_count_infinite_is_refused(world, tmp_path):
    """Was: scale = 1e300 accepted, every FLOP count Infinity."""
    km = tmp_path / "km.toml"
    km.write_text('schema = "keymap/1"\n[keys]\nflops = { from = "gflops", scale = 1e300 }\n')
    code, _, err = run_cli("watch", world / "pre" / "prereg.json", "--source",
                           world / "live.jsonl", "--keys", km)
    _one_line(code, err, "km.toml", "keys.flops.scale")


def test_a_deeply_nested_keymap_is_one_line(world, tmp_path):
    """Was: a RecursionError from tomllib."""
    km = tmp_path / "deep.toml"
    km.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    code, _, err = run_cli("watch", world / "pre" / "prereg.json", "--source",
                           world / "live.jsonl", "--keys", km)
    _one_line(code, err, "deep.toml")


@FAST
@given(keys=st.dictionaries(st.text(min_size=1, max_size=4), _JSON, min_size=1, max_size=3))
def test_any_keymap_table_is_a_finite_map_or_a_named_refusal(keys):
    from ladder.sources.keymap import parse_keymap
    try:
        km = parse_keymap({"schema": "keymap/1", "keys": keys})
    except ValueError as e:
        assert str(e).split(": ")[0]  # 'field: message'
        return
    for _, _, s in km.entries:
        assert math.isfinite(1e290 * s) and 1e-300 * s > 0


# ---------------------------------------------- class 3: a restarted watcher never re-judges


def _watch_steps(prereg: Path, source, state: Path) -> tuple[list[int], int]:
    """The steps one watcher judges (every batch it hands its listeners), and its exit status."""
    from ladder.predict.live import Watcher
    w = Watcher(prereg, source, [], state)
    seen: list[int] = []
    w.listeners.append(lambda view, batch: seen.extend(int(s) for s in batch.step))
    w.poll()
    return seen, w.exit_code


def test_a_renamed_wandb_segment_is_not_judged_again(world, tmp_path):
    """Was: a restarted watcher whose saved segment was renamed judged every row again under
    the saved hysteresis (a healthy run got a critical alert)."""
    from ladder.sources import WandbOfflineSource
    rows = [json.loads(x) for x in (world / "live.jsonl").read_text().splitlines()]
    half = len(rows) // 2
    seg = tmp_path / "wandb" / "run-20261201_080000-abc" / "run-abc.wandb"
    _wandb_log(seg, _history(rows[:half]))
    state = tmp_path / "state.json"
    first, _ = _watch_steps(world / "pre" / "prereg.json", WandbOfflineSource(seg.parent.parent),
                            state)
    assert first == [r["step"] for r in rows[:half]]
    moved = tmp_path / "wandb" / "run-20261201_080000-abd" / "run-abd.wandb"
    shutil.move(seg.parent, moved.parent)
    (moved.parent / "run-abc.wandb").rename(moved)
    _wandb_log(moved, _history(rows))
    second, code = _watch_steps(world / "pre" / "prereg.json",
                                WandbOfflineSource(moved.parent.parent), state)
    assert second == [r["step"] for r in rows[half:]]
    assert code == 0


def test_a_state_of_another_source_kind_judges_no_step_twice(world, tmp_path):
    """The same run watched first from its metrics.jsonl, then (restarted, same --state) from
    its W&B offline log: the second watch judges only the steps after the first's."""
    from ladder.sources import JsonlSource, WandbOfflineSource
    rows = [json.loads(x) for x in (world / "live.jsonl").read_text().splitlines()]
    half = len(rows) // 2
    part = tmp_path / "metrics.jsonl"
    part.write_text("".join(json.dumps(r) + "\n" for r in rows[:half]))
    state = tmp_path / "state.json"
    first, _ = _watch_steps(world / "pre" / "prereg.json", JsonlSource(part), state)
    seg = tmp_path / "wandb" / "run-20261201_080000-abc" / "run-abc.wandb"
    _wandb_log(seg, _history(rows))
    second, code = _watch_steps(world / "pre" / "prereg.json",
                                WandbOfflineSource(seg.parent.parent), state)
    assert not set(first) & set(second) and sorted(first + second) == [r["step"] for r in rows]
    assert code == 0


@FAST
@given(cut=st.integers(3, 30), kind=st.sampled_from(["rotate", "truncate", "csv-shrink"]))
def test_a_source_read_again_from_its_start_judges_no_step_twice(world, tmp_path_factory, cut,
                                                                 kind):
    """Property: whatever makes a source read its rows again from the start (a rotated or
    truncated JSONL, a CSV that shrank), the watcher judges each step once and skips none."""
    from ladder.predict.live import Watcher
    from ladder.sources import CsvSource, JsonlSource
    d = tmp_path_factory.mktemp("again")
    rows = [json.loads(x) for x in (world / "live.jsonl").read_text().splitlines()]
    cut = min(cut, len(rows) - 1)
    keys = list(rows[0])
    p = d / ("m.csv" if kind == "csv-shrink" else "m.jsonl")

    def text(rs):
        if kind == "csv-shrink":
            return ",".join(keys) + "\n" + "".join(",".join(str(r[k]) for k in keys) + "\n"
                                                   for r in rs)
        return "".join(json.dumps(r) + "\n" for r in rs)
    p.write_text(text(rows[:cut]))
    w = Watcher(world / "pre" / "prereg.json",
                CsvSource(p) if kind == "csv-shrink" else JsonlSource(p), [], None)
    seen: list[int] = []
    w.listeners.append(lambda view, batch: seen.extend(int(s) for s in batch.step))
    w.poll()
    if kind == "rotate":   # a new file in its place, from an earlier row on
        p.unlink()
        p.write_text(text(rows[1:]))
    else:                  # the file cut back (shorter), then written on
        p.write_text(text(rows[cut - 1:cut]))
        w.poll()
        p.write_text(text(rows[cut - 1:]))
    w.poll()
    assert sorted(seen) == [r["step"] for r in rows], (kind, cut, seen)


def test_a_multi_metric_prereg_given_runs_without_its_keys_is_refused(world, tmp_path):
    """Was: written with zero eval noise and 'no --runs' in its record; the healthy target then
    went critical on every metric."""
    law = _law(world)
    law2 = {"schema": "law/2", "laws": {k: {**law, "metric": k}
                                        for k in ("paloma/a/loss", "paloma/b/loss")},
            "created": law.get("created"), "tool_version": law.get("tool_version")}
    (tmp_path / "law2.json").write_text(json.dumps(law2))
    code, _, err = run_cli("preregister", tmp_path / "law2.json", "--target-spec",
                           world / "target.json", "--runs", world / "runs", "--out",
                           tmp_path / "p.json")
    _one_line(code, err, "runs", "--runs", "paloma/a/loss")
    assert not (tmp_path / "p.json").exists()


def test_runs_are_read_under_the_law_s_key_map(world, tmp_path):
    """The other way out: a law fitted through a key map (conventions.metric_keys) reads --runs
    under it, and estimates the eval noise of its metric from the runs' own key."""
    law = _law(world)
    law = {**law, "metric": "x/loss",
           "conventions": {**law["conventions"],
                           "metric_keys": {"name": "t", "keys": {"x/loss": "eval_dropless/loss"}}}}
    (tmp_path / "law.json").write_text(json.dumps(law))
    code, _, err = run_cli("preregister", tmp_path / "law.json", "--target-spec",
                           world / "target.json", "--runs", world / "runs", "--out",
                           tmp_path / "p.json")
    assert code == 0, err
    noise = json.loads((tmp_path / "p.json").read_text())["eval_noise"]
    assert noise["n"] > 0 and not noise["method"].startswith("none"), noise


# --------------------------------------------------------- class 4: bounded memory and time


@pytest.mark.heavy  # 5 s on 2 busy cores
def test_a_large_wandb_log_is_streamed_not_read_whole(tmp_path):
    """Was: the record log read whole (a 7 GiB log: MemoryError). A 768 MiB log (sparse: its
    blocks after the records are zero, as a preallocated file's) read under a 256 MiB cap."""
    from ladder.sources import WandbOfflineSource
    seg = tmp_path / "run-20261201_080000-abc" / "run-abc.wandb"
    _wandb_log(seg, _history([{"step": s, "train/loss": 2.0} for s in range(1, 50)]))
    with open(seg, "r+b") as f:
        f.truncate(768 << 20)
    src = WandbOfflineSource(tmp_path)
    with address_space_cap(256 << 20):
        got = src.poll()
    assert [r["step"] for r in got.rows] == list(range(1, 50))


def test_a_record_split_over_many_blocks_is_joined_once_and_whole(tmp_path):
    """A 5 MB history value over ~160 blocks decodes to the value written (joined once from its
    fragments: bench/fuzz_readers.py times 50 MB, a minute before)."""
    from ladder.sources import read_wandb_records
    seg = tmp_path / "x.wandb"
    big = "y" * (5 << 20)
    _wandb_log(seg, _history([{"step": 1, "blob": big}, {"step": 2, "train/loss": 2.0}]))
    recs = list(read_wandb_records(seg))
    assert [r["history"]["step"]["num"] for r in recs] == [1, 2]
    assert recs[0]["history"]["item"]["blob"] == big


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 70_000), min_size=1, max_size=6),
       read=st.sampled_from([7, 4096, 32768 + 7, 1 << 22]), cut=st.floats(0.0, 1.0),
       budget=st.none() | st.integers(1, 200_000))
def test_streamed_decoding_equals_the_whole_file_whatever_the_reads(tmp_path_factory, sizes,
                                                                    read, cut, budget):
    """Property: the streamed decoder gives the records of the log (any record sizes, any read
    size, a log cut anywhere by a writer mid-record), continued from its ``end`` it gives the
    rest, and a poll budget only splits them."""
    from ladder.sources import wandb as W
    d = tmp_path_factory.mktemp("wb")
    rows = [{"step": i + 1, "pad": "z" * n} for i, n in enumerate(sizes)]
    p = d / "x.wandb"
    _wandb_log(p, _history(rows))
    data = p.read_bytes()
    p.write_bytes(data[:max(7, int(len(data) * cut))])
    old = W.READ_BYTES
    W.READ_BYTES = read
    try:
        got, start = [], 0
        for _ in range(len(rows) + 2):
            stats: dict = {}
            got += [r["history"]["step"]["num"] for r in
                    W.iter_wandb_records(p, start, max_bytes=budget, stats=stats)]
            assert stats["bad"] == 0
            start = stats["end"]
            if not stats["more"]:
                break
        p.write_bytes(data)  # the writer finishes: the rest from ``end``
        stats = {}
        got += [r["history"]["step"]["num"] for r in W.iter_wandb_records(p, start, stats=stats)]
    finally:
        W.READ_BYTES = old
    assert got == [r["step"] for r in rows]


def _big_line_gz(path: Path, n: int) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"text": "')
        chunk = b"a" * (1 << 20)
        for _ in range(n >> 20):
            f.write(chunk)
        f.write(b'"}\n')
    return path


def test_a_small_gz_expanding_to_one_huge_line_is_one_line(tmp_path, tok_path):
    """Was: the line read whole (a 3 GiB line from a few MB of .jsonl.gz). A 512 MiB line under
    a 384 MiB cap: refused with one line naming the file."""
    from ladder.trainer import tokens as T
    src = _big_line_gz(tmp_path / "big.jsonl.gz", 512 << 20)
    assert src.stat().st_size < (8 << 20)
    with address_space_cap(384 << 20), pytest.raises(InputError, match="big.jsonl.gz.*longer than"):
        T.tokenize_files([str(src)], tok_path, tmp_path / "out", shard_tokens=300)


def test_a_metrics_line_beyond_the_bound_is_skipped_and_later_rows_survive(tmp_path):
    """The metrics readers (ladder.io.iter_jsonl, the watcher's JSONL source) read past a line
    of 64 MiB in pieces, count it corrupt and keep the rows after it."""
    from ladder.io import iter_jsonl
    from ladder.sources import JsonlSource
    p = tmp_path / "metrics.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"step": 1}\n{"step": 2, "x": "')
        for _ in range(64):
            f.write(b"a" * (1 << 20))
        f.write(b'"}\n{"step": 3}\n')
    with address_space_cap(160 << 20):
        bad: list = []
        assert [r["step"] for _, r in iter_jsonl(p, bad=bad)] == [1, 3] and bad == [2]
        got = JsonlSource(p).poll()
    assert [r["step"] for r in got.rows] == [1, 3]
    assert any("line 2" in n for n in got.notes)


@settings(max_examples=20, deadline=None)
@given(n=st.lists(st.integers(0, 40), min_size=1, max_size=3), cap=st.integers(1, 25))
def test_a_wandb_api_history_is_read_in_slices_each_row_once(n, cap):
    """Property: the W&B API source hands a lineage's history over in polls of at most
    ``max_rows`` rows (``Poll.more``), every row once, in lineage order (a 100-day history
    was one poll's list)."""
    from ladder.sources import WandbApiSource

    class Run:
        def __init__(self, rows):
            self.rows, self.state, self.config = rows, "running", {}

        def scan_history(self, page_size=1000, min_step=None):
            return (dict(r) for r in self.rows if min_step is None or r["_step"] >= min_step)

    class Api:
        def __init__(self, runs):
            self.runs = runs

        def run(self, path):
            return self.runs[path.split("/")[-1]]
    runs = {f"r{i}": Run([{"_step": s, "x": float(i)} for s in range(k)])
            for i, k in enumerate(n)}
    src = WandbApiSource("wandb://e/p/" + ",".join(runs), api=Api(runs), max_rows=cap)
    got = []
    for _ in range(sum(n) + 2):
        p = src.poll()
        assert len(p.rows) <= cap
        got += [(r["x"], r["_step"]) for r in p.rows]
        if not p.more:
            break
    assert got == [(float(i), s) for i, k in enumerate(n) for s in range(k)]


# ----------------------------------------------------------------- class 5: the live page


def _page():
    from ladder.reports.live import LivePage
    return LivePage(lambda: {"chart": None, "verdict": [], "tone": "", "alerts": [],
                             "n_alerts": 0}, lambda: 1, port=0)


def test_trickling_clients_do_not_hold_the_live_page(tmp_path):
    """Was: two dozen clients sending one header byte every 2 s held all 16 workers, and
    GET /state.json waited 20 s and more (40 s measured). The head has a deadline now.
    (bench/fuzz_readers.py's trickle_wait: the limit when no 200 came back in time.)"""
    from bench.fuzz_readers import trickle_wait
    assert trickle_wait(clients=24, limit=10.0) < 10.0


def test_the_live_page_serves_loopback_only():
    from ladder.reports.live import LivePage
    with pytest.raises(InputError, match="--host"):
        LivePage(lambda: {}, lambda: 1, port=0, host="0.0.0.0")
    page = _page()
    try:
        def get(*hosts):
            s = socket.create_connection(("127.0.0.1", page.port), timeout=5)
            s.sendall(b"GET /state.json HTTP/1.1\r\n" + b"".join(
                b"Host: " + h.encode() + b"\r\n" for h in hosts) + b"\r\n")
            head = s.recv(64)
            s.close()
            return int(head.split()[1])
        assert get(f"127.0.0.1:{page.port}") == 200
        assert get(f"127.0.0.2:{page.port}") == 200   # 127/8 is this machine
        assert get(f"localhost:{page.port}", "attacker.example") == 403
        assert get("0.0.0.0") == 403
        assert get(f"10.0.0.1:{page.port}") == 403
    finally:
        page.close()


def test_a_slow_but_steady_client_is_still_answered():
    """The deadline is for the head, whole: a client whose head arrives in pieces within it is
    answered."""
    page = _page()
    try:
        s = socket.create_connection(("127.0.0.1", page.port), timeout=5)
        for part in (b"GET /state.json HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", b"\r\n"):
            s.sendall(part)
            time.sleep(0.2)
        assert s.recv(64).split()[1] == b"200"
        s.close()
    finally:
        page.close()

