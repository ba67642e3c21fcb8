"""Several metrics in one law.json (issue 23, item 1): `ladder fit SOURCE --metric KEY [--metric
KEY ...]` (globs over the keys a source holds) from long tables (a `metric` column), wide tables
(a loss column per key) and runs directories; one law/2 file with one law per metric, each fitted
as it would be alone; `ladder predict --metric KEY`; a long table's metrics never collapsed into
one law; old law/1 files still read."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import run_cli, write_law_runs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ladder.fit import load_law, load_laws, load_points
from ladder.fit.law import law_from_json, laws_from_json
from ladder.fit.points import expand_metrics, metric_keys
from ladder.io import EX_DATAERR, EX_USAGE, InputError

DATA = Path(__file__).parent / "data"

# three per-domain laws loss = E + A C^-alpha, each its own (E, A, alpha)
LAWS = {"paloma/c4_en/loss": (1.8, 60.0, 0.09),
        "paloma/wikitext/loss": (1.5, 90.0, 0.11),
        "paloma/reddit/loss": (2.2, 40.0, 0.07)}
COMPUTE = 1e17 * 4.0 ** np.arange(6)          # six runs, 4x apart
FRACTIONS = (0.5, 1.0)
NOISE = 0.002                                 # multiplicative, like eval noise


def long_table(laws=LAWS, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for key, (E, A, alpha) in laws.items():
        for i, C in enumerate(COMPUTE):
            N = (C / 120) ** 0.5
            for f in FRACTIONS:
                rows.append({"run": f"r{i}", "params": N, "active_params": N,
                             "tokens": 20 * N * f, "compute": C * f, "fraction": f,
                             "metric": key, "loss": (E + A * (C * f) ** -alpha)
                             * math.exp(NOISE * rng.standard_normal())})
    return pd.DataFrame(rows)


def wide_table(laws=LAWS, seed=0) -> pd.DataFrame:
    df = long_table(laws, seed)
    wide = df.pivot_table(index=["run", "params", "active_params", "tokens", "compute",
                                 "fraction"], columns="metric", values="loss").reset_index()
    wide.columns.name = None
    return wide


def _one_line_refusal(code, err, exit_code=None):
    lines = [x for x in err.strip().splitlines() if ": warning: " not in x]
    assert code >= 64 and len(lines) == 1 and "Traceback" not in err, (code, err)
    if exit_code is not None:
        assert code == exit_code, (code, err)
    return lines[0]


@pytest.fixture(scope="module")
def fitted_long(tmp_path_factory):
    """The long table fitted once for the module: (table path, law.json path, fit's stdout)."""
    d = tmp_path_factory.mktemp("long")
    csv, law = d / "points.csv", d / "law.json"
    long_table().to_csv(csv, index=False)
    code, out, err = run_cli("fit", csv, "--metric", "paloma/*/loss", "--form", "compute",
                             "--bootstrap", "30", "--out", law)
    assert code == 0, err
    return csv, law, out


def test_long_table_three_metrics_each_law_recovered_within_its_band(fitted_long):
    csv, law, out = fitted_long
    doc = json.loads(law.read_text())
    assert doc["schema"] == "law/2" and list(doc["laws"]) == list(LAWS)
    laws = load_laws(law)
    for key, (E, A, alpha) in LAWS.items():
        inner = doc["laws"][key]
        assert inner["schema"] == "law/3" and inner["metric"] == key
        # each law saw its own metric's rows only: 6 runs x 2 fractions, nothing dropped (the
        # compute form fits each run's final point)
        assert inner["points"]["n"] == len(COMPUTE) * len(FRACTIONS)
        assert inner["inputs"]["n_runs"] == len(COMPUTE)
        assert not inner["diagnostics"].get("dropped_rows")
        assert inner["params"]["alpha"] == pytest.approx(alpha, rel=0.25)
        for C in (COMPUTE[-1], 4 * COMPUTE[-1]):   # the largest run and a step beyond it
            p = laws[key].predict(compute=C, fraction=1.0)
            truth = E + A * C ** -alpha
            assert float(p.lo) <= truth <= float(p.hi), (key, C, truth, p)
    # the report's summary table: one line per metric, with its form and exponent
    table = out[out.index("3 of 3 metrics fitted"):].splitlines()
    for key in LAWS:
        line = [x for x in table if x.strip().startswith(key)]
        assert len(line) == 1 and "compute" in line[0] and "alpha 0." in line[0], table


def test_each_law_is_the_single_metric_fit(fitted_long, tmp_path):
    """A law of the multi-metric file is exactly what `ladder fit --metric KEY` writes alone."""
    csv, law, _ = fitted_long
    key = "paloma/wikitext/loss"
    one = tmp_path / "one.json"
    code, _, err = run_cli("fit", csv, "--metric", key, "--form", "compute", "--bootstrap",
                           "30", "--out", one)
    assert code == 0, err
    single = json.loads(one.read_text())
    assert single["schema"] == "law/3" and single["metric"] == key
    multi = json.loads(law.read_text())["laws"][key]
    assert _timeless(multi) == _timeless(single)


def _timeless(obj):
    """A law.json object without its clock readings (when it was made, how long parts took)."""
    if isinstance(obj, dict):
        return {k: _timeless(v) for k, v in obj.items() if k not in ("created", "seconds")}
    return [_timeless(v) for v in obj] if isinstance(obj, list) else obj


def test_predict_metric_round_trips(fitted_long):
    _, law, _ = fitted_long
    for key in LAWS:
        code, out, err = run_cli("predict", law, "--metric", key, "--compute", "1e21")
        assert code == 0, err
        got = json.loads(out)
        p = load_law(law, metric=key).predict(compute=1e21, fraction=1.0)
        assert [got["loss"], got["lo"], got["hi"]] == [float(p.loss), float(p.lo),
                                                       float(p.hi)]
    # no --metric on a multi-metric file: refused, naming the keys
    code, _, err = run_cli("predict", law, "--compute", "1e21")
    line = _one_line_refusal(code, err, EX_USAGE)
    assert all(k in line for k in LAWS) and "--metric" in line
    code, _, err = run_cli("predict", law, "--metric", "paloma/nope/loss", "--compute", "1e21")
    assert "paloma/nope/loss" in _one_line_refusal(code, err, EX_USAGE)


def test_json_output_carries_every_law_and_the_summary(fitted_long):
    csv, law, _ = fitted_long
    code, out, err = run_cli("fit", csv, "--metric", "paloma/c4_en/loss", "--metric",
                             "paloma/reddit/loss", "--form", "compute", "--bootstrap", "0",
                             "--json", "--out", "")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["schema"] == "law/2" and list(obj["laws"]) == ["paloma/c4_en/loss",
                                                             "paloma/reddit/loss"]
    assert [r["metric"] for r in obj["summary"]] == list(obj["laws"])
    for r in obj["summary"]:
        assert r["form"] == "compute" and set(r["exponents"]) == {"alpha"}
        assert 0 < r["band_half_width_rel"] < 0.05 and r["band_at"]["run"] == "r5"
    assert set(laws_from_json(obj)) == set(obj["laws"])   # what --json prints reads back


def test_wide_table_three_metrics(tmp_path):
    csv, law = tmp_path / "wide.csv", tmp_path / "law.json"
    wide_table().to_csv(csv, index=False)
    assert metric_keys(csv) == sorted(LAWS)   # the pivot sorts its columns
    code, out, err = run_cli("fit", csv, "--metric", "paloma/*", "--form", "compute",
                             "--bootstrap", "20", "--out", law)
    assert code == 0, err
    laws = load_laws(law)
    assert list(laws) == sorted(LAWS)
    for key, (E, A, alpha) in LAWS.items():
        p = laws[key].predict(compute=COMPUTE[-1], fraction=1.0)
        assert float(p.lo) <= E + A * COMPUTE[-1] ** -alpha <= float(p.hi), key


def test_a_long_table_of_several_metrics_is_never_collapsed(tmp_path):
    """The issue's case: a long table whose metric column holds several keys was read as one
    law (its other rows 'dropped: duplicate of an earlier row'). Now: refused without --metric,
    in one line naming the keys, nothing written; one key fits that key's rows only."""
    csv, law = tmp_path / "points.csv", tmp_path / "law.json"
    long_table().to_csv(csv, index=False)
    code, out, err = run_cli("fit", csv, "--form", "compute", "--out", law)
    line = _one_line_refusal(code, err, EX_USAGE)
    assert "'metric'" in line and all(k in line for k in LAWS) and not law.exists()
    with pytest.raises(InputError, match="holds 3 metrics") as e:
        load_points(csv)
    assert e.value.exit_code == EX_USAGE
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = load_points(csv, "paloma/reddit/loss")
    assert not caught and len(df) == len(COMPUTE) * len(FRACTIONS)
    assert df.attrs["metric"] == "paloma/reddit/loss"
    # the rows keep their line numbers in the file (the reddit rows are the last third)
    assert df["row"].min() == 2 * len(COMPUTE) * len(FRACTIONS) + 1
    # a long table of one metric needs no --metric, and its law carries the key, not a label
    one = long_table({"bpb/x": LAWS["paloma/c4_en/loss"]})
    assert load_points(one).attrs["metric"] == "bpb/x"
    # two long tables of different metrics are not read as one law either
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    long_table({"x": LAWS["paloma/c4_en/loss"]}).to_csv(a, index=False)
    long_table({"y": LAWS["paloma/c4_en/loss"]}).to_csv(b, index=False)
    with pytest.raises(InputError, match=r"different metrics \(x, y\)"):
        load_points([a, b])


def test_wide_table_column_wins_over_its_loss_column(tmp_path):
    """--metric KEY on a wide table that also has a `loss` column reads KEY's column (it had
    read `loss`, labelled KEY)."""
    df = wide_table()
    df["loss"] = 9.0
    got = load_points(df, "paloma/wikitext/loss")
    assert np.allclose(got["loss"], df["paloma/wikitext/loss"])
    assert np.allclose(load_points(df)["loss"], 9.0)   # no --metric: the loss column


def test_globs_expand_over_each_kind_of_source(tmp_path):
    long, wide = long_table(), wide_table()
    assert expand_metrics(["paloma/*/loss"], [long]) == list(LAWS)
    assert expand_metrics(["*reddit*", "paloma/*"], [wide]) == [
        "paloma/reddit/loss", "paloma/c4_en/loss", "paloma/wikitext/loss"]   # order, no repeats
    assert expand_metrics(None, [long]) == [None]
    # a wide table's own columns (run, params, ...) are not metrics; its loss column is one
    assert expand_metrics(["*"], [wide.assign(loss=1.0)])[-1] == "loss"
    assert not {"run", "params", "compute"} & set(expand_metrics(["*"], [wide]))
    with pytest.raises(InputError, match="no metric key matches 'zz\\*'") as e:
        expand_metrics(["zz*"], [long])
    assert e.value.exit_code == EX_USAGE
    # several keys: a table must hold each (a wide table's `loss` is never read as another key)
    with pytest.raises(InputError, match="holds no metric named paloma/nope"):
        expand_metrics(["paloma/c4_en/loss", "paloma/nope"], [wide.assign(loss=1.0)])
    # a runs directory: the keys its metrics.jsonl files log
    write_law_runs(tmp_path / "runs")
    assert expand_metrics(["*loss"], [tmp_path / "runs"]) == ["eval_dropless/loss", "train/loss"]
    # W&B runs: their keys are not listed here; exact keys only
    with pytest.raises(InputError, match="name W&B metrics exactly") as e:
        expand_metrics(["eval/*"], ["wandb://e/p/abc"])
    assert e.value.exit_code == EX_USAGE


def test_a_glob_of_one_key_writes_that_metrics_law(tmp_path):
    """The issue's `--metric 'glob'` named the law by the glob; a glob matching one key writes
    today's single-metric law.json (law/3), named by the key."""
    csv, law = tmp_path / "points.csv", tmp_path / "law.json"
    long_table().to_csv(csv, index=False)
    code, out, err = run_cli("fit", csv, "--metric", "paloma/wiki*", "--form", "compute",
                             "--bootstrap", "0", "--out", law)
    assert code == 0, err
    doc = json.loads(law.read_text())
    assert doc["schema"] == "law/3" and doc["metric"] == "paloma/wikitext/loss"
    assert "metrics fitted" not in out   # no summary table for one metric


def test_runs_directory_several_metrics(tmp_path):
    write_law_runs(tmp_path / "runs")
    law = tmp_path / "law.json"
    code, out, err = run_cli("fit", tmp_path / "runs", "--metric", "eval_dropless/loss",
                             "--metric", "train/*", "--form", "compute", "--bootstrap", "0",
                             "--out", law)
    assert code == 0, err
    laws = load_laws(law)
    assert list(laws) == ["eval_dropless/loss", "train/loss"]
    # train/loss is the eval loss + 0.01 at every point (helpers.write_law_runs)
    a = laws["eval_dropless/loss"].predict(compute=1e15).loss
    b = laws["train/loss"].predict(compute=1e15).loss
    assert float(b) > float(a)


@pytest.mark.heavy  # 5 s on 2 busy cores
def test_one_metric_refused_writes_nothing(tmp_path):
    """A metric whose every row is bad is refused, and so is the whole file: one line names
    it, exit 65, an existing law.json is left as it was."""
    df = wide_table()
    df["paloma/broken/loss"] = -1.0
    csv, law = tmp_path / "wide.csv", tmp_path / "law.json"
    df.to_csv(csv, index=False)
    law.write_text("{}")
    code, out, err = run_cli("fit", csv, "--metric", "paloma/*", "--form", "compute",
                             "--bootstrap", "0", "--out", law)
    line = _one_line_refusal(code, err, EX_DATAERR)
    assert "1 of 4 metrics refused" in line and "paloma/broken/loss" in line
    assert "no usable points" in line and law.read_text() == "{}"
    assert "refused" in out   # the summary table says which, beside the three that fitted


def test_old_single_metric_law_files_still_read(tmp_path):
    for name in ("law_main_b81488e.json", "law_main_72fc951_compute.json"):
        path = DATA / name
        law = load_law(path)
        assert load_laws(path) == {law.metric: law} or list(load_laws(path)) == [law.metric]
        assert load_law(path, metric=law.metric).params == law.params
        with pytest.raises(InputError, match="holds the law of one metric") as e:
            load_law(path, metric="bpb/other")
        assert e.value.exit_code == EX_USAGE
        code, out, err = run_cli("predict", path, "--metric", law.metric, "--compute", "1e21",
                                 "--params", "1e9", "--tokens", "2e10")
        assert code == 0, err
        code, _, err = run_cli("predict", path, "--metric", "bpb/other", "--compute", "1e21")
        _one_line_refusal(code, err, EX_USAGE)


def test_law2_reader_names_the_metric_and_field(fitted_long, tmp_path):
    _, law, _ = fitted_long
    doc = json.loads(law.read_text())
    bad = json.loads(json.dumps(doc))
    bad["laws"]["paloma/reddit/loss"]["fit"]["u"] = [1.0]
    with pytest.raises(InputError, match=r"field 'laws\['paloma/reddit/loss'\]\.fit\.u'"):
        law_from_json(bad, path="x.json", metric="paloma/reddit/loss")
    with pytest.raises(InputError, match=r"laws\['paloma/reddit/loss'\]\.fit\.u"):
        laws_from_json(bad, path="x.json")
    # the other laws of the file still read alone
    assert law_from_json(bad, metric="paloma/c4_en/loss").metric == "paloma/c4_en/loss"
    bad = json.loads(json.dumps(doc))
    bad["laws"]["paloma/reddit/loss"]["metric"] = "other"
    with pytest.raises(InputError, match=r"laws\['paloma/reddit/loss'\]\.metric"):
        laws_from_json(bad)
    for laws in ({}, [], None):
        with pytest.raises(InputError, match="field 'laws'"):
            laws_from_json({"schema": "law/2", "laws": laws}, path="x.json")


# ----------------------------------------------------------------------------- generated tables

@st.composite
def multi_case(draw):
    """A generated multi-metric table: 1-4 metrics, long or wide, each with its own law or a
    trouble (flat, NaN, negative, too few runs), and the --metric arguments to fit it with."""
    n = draw(st.integers(1, 4))
    keys = [f"m/{i}" for i in range(n)]
    # mostly healthy metrics, so that many files get written (one bad metric refuses all)
    kinds = draw(st.lists(st.sampled_from(["law"] * 8 + ["flat", "nan", "negative"]),
                          min_size=n, max_size=n))
    return {"keys": keys, "kinds": kinds,
            "alphas": draw(st.lists(st.floats(0.02, 0.5), min_size=n, max_size=n)),
            # hypothesis starts from a list's first element: a ladder that fits
            "runs": draw(st.sampled_from([6, 5, 4, 3, 2, 1])),
            "noise": draw(st.floats(0.0, 0.03)),
            "long": draw(st.booleans()),
            "args": draw(st.sampled_from(["glob", "each", "none", "one", "missing"])),
            "seed": draw(st.integers(0, 2 ** 16))}


def multi_table(c) -> pd.DataFrame:
    rng = np.random.default_rng(c["seed"])
    rows = []
    for key, kind, alpha in zip(c["keys"], c["kinds"], c["alphas"], strict=True):
        for i in range(c["runs"]):
            C = 1e17 * 4.0 ** i
            loss = {"law": 1.5 + 50.0 * C ** -alpha * math.exp(c["noise"] *
                                                                rng.standard_normal()),
                    "flat": 2.5, "nan": math.nan, "negative": -1.0}[kind]
            rows.append({"run": f"r{i}", "compute": C, "fraction": 1.0, "metric": key,
                         "loss": loss})
    df = pd.DataFrame(rows)
    if c["long"]:
        return df
    wide = df.pivot_table(index=["run", "compute", "fraction"], columns="metric",
                          values="loss", dropna=False).reset_index()
    wide.columns.name = None
    return wide


def check_multi_fit(c, tmp_path) -> str:
    csv, law = tmp_path / "t.csv", tmp_path / "law.json"
    if law.exists():
        law.unlink()
    multi_table(c).to_csv(csv, index=False)
    args = {"none": [], "glob": ["--metric", "m/*"],
            "each": [a for k in c["keys"] for a in ("--metric", k)],
            "one": ["--metric", c["keys"][0]],
            "missing": ["--metric", "m/*", "--metric", "zz"]}[c["args"]]
    code, out, err = run_cli("fit", csv, *args, "--form", "compute", "--bootstrap", "5",
                             "--out", law)
    if code != 0:
        _one_line_refusal(code, err)
        assert not law.exists()
        return f"refused ({code})"
    doc = json.loads(law.read_text())
    laws = load_laws(law)
    assert list(laws) == (list(doc["laws"]) if doc["schema"] == "law/2" else [doc["metric"]])
    for key, law_obj in laws.items():
        code, out, err = run_cli("predict", law, "--metric", key, "--compute", "1e22")
        if code != 0:
            _one_line_refusal(code, err)
            continue
        got = json.loads(out)  # non-finite numbers are written as "NaN"/"Infinity" (ladder.io)
        p = law_obj.predict(compute=1e22)
        assert np.array_equal([float(got["loss"]), float(got["lo"]), float(got["hi"])],
                              np.array([p.loss, p.lo, p.hi], float), equal_nan=True), got
    return f"fitted {len(laws)}"


@pytest.mark.heavy  # 4 s on 2 busy cores
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(c=multi_case())
def test_generated_multi_metric_tables(c, tmp_path):
    check_multi_fit(c, tmp_path)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(c=multi_case())
def test_many_generated_multi_metric_tables(c, tmp_path):
    check_multi_fit(c, tmp_path)
