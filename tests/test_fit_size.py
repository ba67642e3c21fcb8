"""Issue 26 item 9: a big table never ends in a MemoryError. The objective is evaluated in slices
of at most ``ladder.fit.estimate.CHUNK_VALUES`` (problems x points) values, so memory is bounded
whatever the table's size, with each problem's numbers as before; a table beyond
``ladder.fit.law.MAX_FIT_ROWS`` points is refused with one line naming the limit."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd
import pytest

from ladder.cli.main import main
from ladder.fit import estimate
from ladder.fit.config import HUBER_DELTA
from ladder.fit.forms import Spec, get_form
from ladder.fit.law import MAX_FIT_ROWS, fit_law


def table(n: int, runs: int = 20, seed: int = 0) -> pd.DataFrame:
    E, A, alpha = 1.6, 40.0, 0.1
    rng = np.random.default_rng(seed)
    per = n // runs
    rows = []
    for i in range(runs):
        p = 1e6 * 1.3 ** i
        g = np.arange(1, per + 1) / per
        tok = 20 * p * g
        c = 6 * p * tok
        loss = (E + A * c ** -alpha) * np.exp(rng.normal(0, 0.003, per))
        rows.append(pd.DataFrame({"run": f"r{i}", "params": p, "active_params": p / 10,
                                  "tokens": tok, "compute": c, "fraction": g, "loss": loss}))
    return pd.concat(rows, ignore_index=True)


@pytest.mark.heavy  # 5 s on 2 busy cores
def test_a_table_beyond_the_limit_is_one_line_naming_it(tmp_path, capsys):
    n = MAX_FIT_ROWS + 20_000  # the 300,000 rows, smaller: the refusal is the same
    p = tmp_path / "big.csv"
    table(n).to_csv(p, index=False)
    assert main(["fit", str(p), "--out", str(tmp_path / "law.json")]) == 65
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "field 'rows'" in last and f"{MAX_FIT_ROWS:,}" in last
    assert not (tmp_path / "law.json").exists()


def _problem(n: int, starts: int):
    from ladder.fit.forms import Model
    df = table(n)
    spec = Spec(get_form("compute"))
    cols = {k: df[k].to_numpy(float) for k in ("params", "active_params", "tokens", "compute")}
    model = Model(spec.form, spec.form.features(cols))
    prob = estimate._Problem(model, np.log(df["loss"].to_numpy()), spec, HUBER_DELTA)
    rng = np.random.default_rng(1)
    X = spec.grid()[rng.integers(0, len(spec.grid()), starts)] @ prob.Pinv.T
    return prob, X


@pytest.mark.heavy  # 10 s on 2 busy cores
def test_an_evaluation_holds_a_slice_not_starts_times_points(monkeypatch):
    """4,000 problems x 20,000 points: 640 MB per temporary at once; in slices, a few tens."""
    prob, X = _problem(20_000, 4_000)
    fg = prob.fg()
    rows = np.arange(len(X))
    tracemalloc.start()
    f, G = fg(X, rows)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 400e6, peak / 1e6
    # the same numbers as one evaluation per problem
    for i in (0, 1234, 3999):
        f1, G1 = fg(X[i:i + 1], rows[i:i + 1])
        np.testing.assert_allclose(f[i], f1[0], rtol=1e-12)
        np.testing.assert_allclose(G[i], G1[0], rtol=1e-10, atol=1e-12)


@pytest.mark.heavy  # 7 s on 2 busy cores
def test_a_fit_in_slices_equals_the_fit_at_once(monkeypatch):
    df = table(400, runs=8)
    whole = fit_law(df, form="compute", bootstrap=30, backtest=False)
    monkeypatch.setattr(estimate, "CHUNK_VALUES", 1000)  # slices of 2 problems
    sliced = fit_law(df, form="compute", bootstrap=30, backtest=False)
    for k in ("E", "A", "alpha"):
        assert sliced.params[k] == pytest.approx(whole.params[k], rel=1e-9)
    for k, iv in whole.intervals.items():
        assert sliced.intervals[k] == pytest.approx(iv, rel=1e-6)
