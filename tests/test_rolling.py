"""ladder.predict.rolling against pandas' rolling median: the same numbers, to the bit, for the
windows the health rules use and the cases the rank filter leaves to pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.predict.rolling import rolling_median


def _pandas(x, w, minp):
    return pd.Series(x).rolling(w, min_periods=minp).median().to_numpy(float)


def _same(a, b):
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    assert np.array_equal(a[ok].view(np.uint64), b[ok].view(np.uint64))


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 7, 8, 16, 20, 21, 31, 32, 50])
@pytest.mark.parametrize("kind", ["noise", "ties", "inf", "zeros", "nan", "short"])
def test_equal_to_pandas(w, kind):
    rng = np.random.default_rng(w)
    n = 3 * w + 200 if kind != "short" else max(1, w // 2)
    x = rng.normal(1.0, 0.1, n)
    if kind == "ties":  # few distinct values: many equal entries in a window
        x = np.round(x, 1)
    elif kind == "inf":
        x[rng.random(n) < 0.1] = np.inf
        x[rng.random(n) < 0.1] = -np.inf
    elif kind == "zeros":  # both zeros: left to pandas
        x = np.where(rng.random(n) < 0.5, 0.0, -0.0) * (rng.random(n) < 0.7)
    elif kind == "nan":
        x[rng.random(n) < 0.1] = np.nan
    for minp in sorted({1, max(1, w // 4), w}):
        _same(rolling_median(x, w, minp), _pandas(x, w, minp))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32),
                min_size=1, max_size=150),
       st.integers(1, 60), st.data())
def test_equal_to_pandas_on_generated_series(values, w, data):
    """Any finite series (float32 values: many ties and both zeros among them), any window."""
    minp = data.draw(st.integers(1, w))
    x = np.array(values, dtype=np.float64)
    _same(rolling_median(x, w, minp), _pandas(x, w, minp))
