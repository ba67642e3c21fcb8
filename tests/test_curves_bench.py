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


# Luo et al. 2025 report 0.110% / 0.142% / 0.168% on the held-out schedules; issue #6 asks for
# <= 0.2% per size. Schaipp et al.: the cooldown order predicted at longer horizons.
@pytest.mark.slow
@needs_anchors
@pytest.mark.parametrize("row, detail", [(luo_multipower, "summary"),
                                         (schaipp_cooldown_order, "groups")],
                         ids=["luo_holdout_within_0.2pct", "schaipp_cooldown_order"])
def test_published_curve_rows_pass(row, detail):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = row(DEFAULT_ANCHORS)
    assert r["passed"], r["detail"][detail]
