"""predict.watch.rolling against pandas' rolling median: the same numbers, to the bit, for the
windows the health rules use and the cases the network leaves to pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predict.watch import rolling
from predict.watch.rolling import _network, rolling_median


def _pandas(x, w, minp):
    return pd.Series(x).rolling(w, min_periods=minp).median().to_numpy(float)


def _same(a, b):
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    assert np.array_equal(a[ok].view(np.uint64), b[ok].view(np.uint64))


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 7, 8, 16, 20, 21, 31, 32, 50])
@pytest.mark.parametrize("kind", ["noise", "ties", "inf", "zeros", "nan", "short"])
def test_equal_to_pandas(w, kind, monkeypatch):
    monkeypatch.setattr(rolling, "_CHUNK", 37)  # several passes, the last one shorter
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


def test_the_network_sorts_every_zero_one_input():
    """A comparator network that puts every 0/1 input in order puts every input in order (the
    0-1 principle, Knuth TAOCP 5.3.4): checked, for the two middle places, on all 2**n inputs of
    each width up to 20 (the rules' window)."""
    for n in range(1, 21):
        codes = np.arange(2 ** n, dtype=np.uint32)
        cols = [((codes >> i) & 1).astype(np.uint8) for i in range(n)]
        ones = sum(c.astype(np.int64) for c in cols)
        for i, j in _network(n):
            cols[i], cols[j] = np.minimum(cols[i], cols[j]), np.maximum(cols[i], cols[j])
        for place in {(n - 1) // 2, n // 2}:  # sorted: place k holds 1 iff k >= n - ones
            assert np.array_equal(cols[place], (place >= n - ones).astype(np.uint8)), (n, place)
