"""The columnar Batch path (rows in runs of one shape, turned into columns in C) against the
general one (one value at a time), and the JSONL source's NaN handling on a large file."""

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.sources import JsonlSource
from ladder.predict.watch import Batch


def _rows():
    rows = []
    for s in range(1, 4001):
        r = {"step": s, "a": s / 10, "i": 2 * s}
        if s % 500 < 3:
            r["b"] = 1.5          # a sparse key (a run of another shape): NaN elsewhere
        if s % 1300 == 0:
            r["c"] = math.inf     # written non-finite (1e999 parses to inf)
        if s % 1900 == 0:
            r["e"] = "NaN"        # NaN as a string: written non-finite
        rows.append(r)
    rows.append({"step": 3, "a": 9.0, "i": 6})   # a rewound step: last one wins
    rows.append({"x": 1})                        # no step: skipped with a note
    return rows


def _same(fast: Batch, slow: Batch) -> None:
    assert fast.notes == slow.notes
    np.testing.assert_array_equal(fast.step, slow.step)
    assert set(fast.cols) == set(slow.cols)
    for k in fast.cols:
        np.testing.assert_array_equal(fast.cols[k], slow.cols[k])
    assert set(fast.nonfinite) == set(slow.nonfinite)
    for k in fast.nonfinite:
        np.testing.assert_array_equal(fast.nonfinite[k], slow.nonfinite[k])


def test_columnar_path_equals_the_general_one():
    rows = _rows()
    fast = Batch._columns_fast(rows, None, None)
    assert fast is not None  # the runs of shapes are few: the columnar path is taken
    slow = Batch._from_rows_general(rows, None, None)
    _same(fast, slow)
    assert "1 row(s) without a step (an integer 0..2**53) skipped" in fast.notes
    np.testing.assert_array_equal(fast.step, np.arange(1, 4001))
    assert set(fast.cols) == {"a", "b", "c", "e", "i"}
    assert fast.cols["a"][2] == 9.0
    assert set(fast.nonfinite) == {"c", "e"}
    np.testing.assert_array_equal(np.flatnonzero(fast.nonfinite["c"]) + 1, [1300, 2600, 3900])
    assert not fast.nonfinite["e"][:1899].any() and fast.nonfinite["e"][1899]
    assert math.isnan(fast.cols["b"][10]) and fast.cols["b"][500] == 1.5


def test_a_step_is_read_as_the_one_step_reader_reads_it():
    """A step of 2.5, -1, 1e20 or 2**53 + 2 is no step (ladder.io.step_of), on both paths; cast
    to int64 they became 2, -1 and -2**63 and were judged at those steps."""
    from ladder.io import MAX_STEP, step_of
    odd = [2.5, -1, 1e20, MAX_STEP + 2, MAX_STEP]
    rows = [{"step": s, "a": 1.0} for s in range(1, 101)] + [{"step": s, "a": 2.0} for s in odd]
    fast = Batch._columns_fast(rows, None, None)
    assert fast is not None
    _same(fast, Batch._from_rows_general(rows, None, None))
    np.testing.assert_array_equal(fast.step, [s for s in range(1, 101)] + [MAX_STEP])
    assert [step_of(s) for s in odd] == [None, None, None, None, MAX_STEP]
    assert "4 row(s) without a step (an integer 0..2**53) skipped" in fast.notes


def test_a_non_numeric_value_takes_the_general_path_with_its_note():
    rows = _rows()
    rows[7]["a"] = "oops"
    assert Batch._columns_fast(rows, None, None) is None
    b = Batch.from_rows(rows)
    assert "1 non-numeric value(s) of 'a' ignored" in b.notes and math.isnan(b.cols["a"][7])


VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10 ** 20, 10 ** 20),
                   st.sampled_from(["NaN", "Infinity", "-Infinity", "1.5", "x", None, True]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(shapes=st.lists(st.lists(st.sampled_from(["a", "b", "c", "params/norm/x", "step"]),
                                min_size=1, max_size=5, unique=True), min_size=1, max_size=3),
       runs=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40)), min_size=1, max_size=6),
       data=st.data())
def test_any_rows_give_the_general_paths_columns(shapes, runs, data):
    """Rows in runs of shapes with any values: ``from_rows`` (columnar when it applies) gives
    the general conversion's steps, columns, masks and notes."""
    rows, step = [], 0
    for which, length in runs:
        keys = shapes[which % len(shapes)]
        for _ in range(length):
            step += 1
            r = {k: (step if k == "step" and data.draw(st.booleans()) else data.draw(VALUES))
                 for k in keys}
            rows.append(r)
    for keys, keep in ((None, None), (["a", "step"], None), (["a"], lambda k: k.startswith("p"))):
        _same(Batch.from_rows(rows * 3, keys=keys, keep=keep),
              Batch._from_rows_general(rows * 3, keys, keep))


def test_a_bare_nan_token_in_a_large_file_is_still_written_non_finite(tmp_path):
    p = tmp_path / "metrics.jsonl"
    with open(p, "w") as f:
        for s in range(1, 3001):
            r = {"step": s, "train/loss": 3.0}
            if s % 100 == 0:
                r["eval/loss"] = 2.9   # missing elsewhere: not non-finite
            f.write(json.dumps(r) + "\n")
    b = JsonlSource(p).poll_batch(None, None).batch
    assert len(b) == 3000 and b.nonfinite == {}
    with open(p, "a") as f:
        f.write(json.dumps({"step": 3001, "train/loss": float("nan")}) + "\n")  # bare NaN
        f.writelines(json.dumps({"step": s, "train/loss": 3.0}) + "\n"
                     for s in range(3002, 6000))
    b2 = JsonlSource(p).poll_batch(None, None).batch
    assert np.flatnonzero(b2.nonfinite["train/loss"]).tolist() == [3000]
    assert "eval/loss" not in b2.nonfinite


def test_a_key_holding_lists_of_one_length_is_not_a_column_of_numbers():
    """Rows whose watched key holds lists of one length made np.array a 2-D column, and
    concatenating two polls' batches crashed (hypothesis found it, on the speed24 branch):
    such values are non-numeric, with a note, like any other value that is not a number."""
    from ladder.sources.batch import concat_batches
    rows = [{"step": s, "a": [1.0, 2.0], "b": s / 2} for s in range(1, 6)]
    first = Batch.from_rows(rows[:4], keys=["a", "b"])
    second = Batch.from_rows(rows[4:], keys=["a", "b"])
    for b in (first, second):
        assert b.col("a").ndim == 1 and np.isnan(b.col("a")).all()
        assert any("non-numeric value(s) of 'a'" in n for n in b.notes), b.notes
    both = concat_batches([first, second])
    np.testing.assert_array_equal(both.step, [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(both.col("b"), [0.5, 1.0, 1.5, 2.0, 2.5])
