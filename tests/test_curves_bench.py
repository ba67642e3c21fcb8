"""The curve-law accuracy rows (bench/accuracy_curves.py): clean skip without the anchors, and
(slow) the published-data checks themselves."""

from __future__ import annotations

import warnings

import pytest

from bench.accuracy_curves import (  # the repo root is on sys.path (pyproject: pythonpath)
    DEFAULT_ANCHORS,
    ROWS,
    luo_multipower,
    schaipp_cooldown_order,
)


@pytest.mark.parametrize("row", ROWS)
def test_rows_skip_cleanly_without_anchors(row, tmp_path):
    r = row(tmp_path / "no_anchors")
    assert "skipped" in r and r["name"]


needs_anchors = pytest.mark.skipif(not (DEFAULT_ANCHORS / "multipower_luo2025").is_dir(),
                                   reason="shared/anchors not present")


@pytest.mark.slow
@needs_anchors
def test_luo_holdout_schedules_within_two_tenths_of_a_percent():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = luo_multipower(DEFAULT_ANCHORS)
    # Luo et al. 2025 report 0.110% / 0.142% / 0.168%; issue #6 asks for <= 0.2% per size
    assert r["passed"], r["detail"]["summary"]


@pytest.mark.slow
@needs_anchors
def test_schaipp_cooldown_order_predicted_at_longer_horizons():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = schaipp_cooldown_order(DEFAULT_ANCHORS)
    assert r["passed"], r["detail"]["groups"]
