"""The columnar Batch path (taken when the source text holds no NaN token) against the general one,
and the NaN-token guard of the JSONL source."""

import json
import math

import numpy as np

from predict.sources import JsonlSource
from predict.watch import Batch


def _rows():
    rows = []
    for s in range(1, 4001):
        r = {"step": s, "a": s / 10, "i": 2 * s}
        if s % 7 == 0:
            r["b"] = 1.5          # a sparse key: NaN elsewhere, and not "written non-finite"
        if s % 11 == 0:
            r["a"] = "oops"       # a non-numeric value: a note, NaN
        if s % 13 == 0:
            r["c"] = 1e999        # parses to inf: written non-finite
        if s % 19 == 0:
            r["e"] = "NaN"        # NaN as a string: written non-finite
        rows.append(r)
    rows.append({"step": 3, "a": 9.0})   # a rewound step: last one wins
    rows.append({"x": 1})                # no step: skipped with a note
    return rows


def test_columnar_path_equals_the_general_one():
    rows = _rows()
    fast = Batch.from_rows(rows, nan_tokens=False)
    slow = Batch.from_rows(rows)
    assert fast.notes == slow.notes
    assert "1 row(s) without a numeric 'step' skipped" in fast.notes
    assert "363 non-numeric value(s) of 'a' ignored" in fast.notes  # 4000 // 11 = 363
    np.testing.assert_array_equal(fast.step, np.arange(1, 4001))
    assert set(fast.cols) == set(slow.cols) == {"a", "b", "c", "e", "i"}
    for k in fast.cols:
        np.testing.assert_array_equal(fast.cols[k], slow.cols[k])
    assert fast.cols["a"][2] == 9.0 and math.isnan(fast.cols["a"][10])
    assert set(fast.nonfinite) == set(slow.nonfinite) == {"c", "e"}
    np.testing.assert_array_equal(np.flatnonzero(fast.nonfinite["c"]) + 1,
                                  np.arange(13, 4001, 13))
    np.testing.assert_array_equal(fast.nonfinite["e"], slow.nonfinite["e"])


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
