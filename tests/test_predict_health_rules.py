"""The scale-aware health rules on series whose noise and faults are known.

Spike: robust z-score against the trailing median/MAD, k calibrated on the ladder. Router and
drop fraction: the ladder's envelope across rungs widened by a leave-one-rung-out tolerance.
Trend: 'better' is info, the threshold follows the band's width and the run's own noise.
"""

import json
import math

import numpy as np
import pytest

from ladder.predict import forecast as fc
from tests import synthetic as sy
from ladder.predict.prereg import make_prereg
from ladder.predict.watch import WatchConfig, check

TRUTH = sy.Truth()
RUNGS = sy.ladder_targets(4, steps0=150)       # 150, 300, 600, 1200 steps
TARGET = RUNGS[-1]
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)
NOISE = sy.RunNoise(run_sigma=0.005, eval_sigma=0.003)


def warns(alerts, kind=None):
    return [a for a in alerts if a.severity != "info" and (kind is None or a.kind == kind)]


def write_ladder(tmp_path, rows_per_rung):
    for name, rows in rows_per_rung.items():
        d = tmp_path / name
        d.mkdir()
        with open(d / "metrics.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(tmp_path)


# ------------------------------------------------------------------------------ spike


def test_spike_scores_of_gaussian_noise_and_of_a_known_spike():
    """On a falling curve with Gaussian noise of sd 0.05 the robust z of every row stays far below
    the default k of 7 (max of 3000 N(0,1) draws is about 3.5-4); a +1.0 jump is ~20 sd."""
    rng = np.random.default_rng(0)
    n = 3000
    x = 3.0 * np.exp(-np.arange(n) / 2000) + rng.normal(0, 0.05, n)
    z = fc.spike_scores(x, 50).z
    # a quarter window for the median, another for the MAD of the deviations from it
    assert np.isnan(z[:12]).all() and np.isfinite(z[30:]).all()
    assert np.nanmax(z) < 6.0
    x[2000] += 1.0
    z2 = fc.spike_scores(x, 50).z
    assert 14 < z2[2000] < 30
    assert np.nanmax(np.delete(z2, 2000)) < 6.0  # the spike does not move its neighbours' z


def _noisy_run(seed, sigma_rel, fault=None):
    """A run whose train loss has relative per-step noise ``sigma_rel`` (the real cpu hero at 4k
    tokens a step: ~3%, single steps 11% above the trailing median)."""
    rows = sy.make_run(TRUTH, TARGET, noise=NOISE, seed=seed, fault=fault or sy.Fault()).rows
    rng = np.random.default_rng(seed + 99)
    for r in rows:
        r["train/loss"] = float(r["train/loss"] * math.exp(rng.normal(0, sigma_rel)))
    return rows


@pytest.fixture(scope="module")
def noisy_ladder(tmp_path_factory):
    """Ladder rungs with 4% train-loss noise: preregister calibrates spike_k on them."""
    tmp = tmp_path_factory.mktemp("noisy")
    rows = {}
    for i, t in enumerate(RUNGS[:3]):
        r = sy.make_run(TRUTH, t, noise=NOISE, seed=i).rows
        rng = np.random.default_rng(i + 7)
        for row in r:
            row["train/loss"] = float(row["train/loss"] * math.exp(rng.normal(0, 0.04)))
        rows[t.name] = r
    return write_ladder(tmp, rows)


def test_healthy_noisy_train_loss_raises_no_spike_but_an_lr_spike_does(noisy_ladder):
    doc = make_prereg(LAW, TARGET, runs=noisy_ladder, eval_noise=0.003)
    params = doc["decision_rule"]["parameters"]
    cal = doc["decision_rule"]["calibration"]["spike_k"]
    assert cal["runs"] == 3 and cal["max_z"] > 0
    assert params["spike_k"] == pytest.approx(max(7.0, 1.5 * cal["max_z"]), rel=1e-3)
    for seed in range(3):  # 4% noise: +10% rows are 2.5 sd, every few hundred steps
        res = check(doc, _noisy_run(seed, 0.04), None, now=0)
        assert warns(res.alerts, "spike") == []
    # the learning rate x10 at 60%: train loss +40% within 3 steps (10 sd of this noise)
    rows = _noisy_run(5, 0.04, sy.Fault("lrspike", 0.6, 0.40))
    res = check(doc, rows, None, now=0)
    sp = warns(res.alerts, "spike")
    onset = math.ceil(0.6 * TARGET.steps)
    assert len(sp) >= 1 and onset <= sp[0].step <= onset + 3
    assert sp[0].extra["z"] > params["spike_k"]


def test_spike_k_is_raised_above_a_heavy_tailed_ladder():
    """Ladder runs with occasional +30% outliers (heavy tails, 0.03 noise on 3.0: a +0.9 outlier is
    ~30 sd): the ladder's largest z is far above the default k, so preregister (1.5x it, see the
    test above) sets k above outliers of that size."""
    rng = np.random.default_rng(3)
    runs = []
    for i in range(3):
        x = 3.0 + rng.normal(0, 0.03, 400)
        x[rng.choice(400, 3, replace=False)] *= 1.3
        runs.append(fc.LadderRun(path="-", name=f"r{i}", steps=400,
                                 rows=[{"step": s + 1, "train/loss": float(v)}
                                       for s, v in enumerate(x)]))
    cal = fc.calibrate_spike_k(runs, 50)
    assert cal["runs"] == 3 and cal["max_z"] > 12


# ------------------------------------------------------------------------------ envelope


def test_envelope_tolerance_by_hand():
    """Three rungs at levels 1, 2, 4: held out, the lowest is log 2 below the others' min and the
    highest log 2 above their max. With two rungs there is nothing to leave out: None."""
    m = np.array([[1.0, 1.0, np.nan], [2.0, 2.0, 2.0], [4.0, 4.0, 4.0]])
    tol = fc.envelope_tolerance(m)
    assert tol["below"] == pytest.approx(math.log(2))
    assert tol["above"] == pytest.approx(math.log(2))
    assert fc.envelope_tolerance(m[:2])["below"] is None


@pytest.fixture(scope="module")
def entropy_ladder(tmp_path_factory):
    """Router entropy falling with size across three rungs (1.6, 1.3, 1.05: about x0.8 a rung),
    load max/mean rising (1.4, 1.6, 1.8), drop fraction 2-4%; noise 3% per row."""
    tmp = tmp_path_factory.mktemp("entropy")
    rows = {}
    for i, (t, h, ld, dr) in enumerate(zip(RUNGS[:3], (1.6, 1.3, 1.05), (1.4, 1.6, 1.8),
                                           (0.02, 0.03, 0.04), strict=True)):
        r = sy.make_run(TRUTH, t, noise=NOISE, seed=20 + i).rows
        rng = np.random.default_rng(30 + i)
        for row in r:
            row["moe/router_entropy"] = float(h * math.exp(rng.normal(0, 0.03)))
            row["moe/load_max_over_mean"] = float(ld * math.exp(rng.normal(0, 0.03)))
            row["moe/drop_frac"] = float(dr * math.exp(rng.normal(0, 0.1)))
        rows[t.name] = r
    return make_prereg(LAW, TARGET, runs=write_ladder(tmp, rows), eval_noise=0.003)


def _target_rows(seed, entropy, load=2.0, drop=0.05, collapse_at=None):
    rows = sy.make_run(TRUTH, TARGET, noise=NOISE, seed=seed).rows
    rng = np.random.default_rng(seed)
    for r in rows:
        h, ld = entropy, load
        if collapse_at is not None and r["progress"] >= collapse_at:
            h, ld = 0.1, 3.9
        r["moe/router_entropy"] = float(h * math.exp(rng.normal(0, 0.03)))
        r["moe/load_max_over_mean"] = float(ld * math.exp(rng.normal(0, 0.03)))
        r["moe/drop_frac"] = float(drop * math.exp(rng.normal(0, 0.1)))
    return rows


def test_next_size_continuing_the_ladder_trend_is_healthy(entropy_ladder):
    """The target one size up continues the trend (entropy 0.85 < the ladder's min 1.05; load 2.0
    and drop 5% above its max): no alert, where 75% of the ladder's mean (1.0) would warn."""
    sig = entropy_ladder["health_reference"]["signals"]["moe/router_entropy"]
    assert 0.1 < sig["tolerance"]["below"] < 0.35  # adjacent rungs ~ log(1.24) apart
    res = check(entropy_ladder, _target_rows(1, 0.85), None, now=0)
    assert warns(res.alerts) == []


def test_router_collapse_is_caught(entropy_ladder):
    res = check(entropy_ladder, _target_rows(2, 0.85, collapse_at=0.5), None, now=0)
    r = warns(res.alerts, "router")
    assert {a.extra["key"] for a in r} == {"moe/router_entropy", "moe/load_max_over_mean"}
    assert all(0.5 <= a.fraction <= 0.53 for a in r)  # trailing median of 20 rows (1.7%)


def test_drop_fraction_far_above_the_ladder_is_critical(entropy_ladder):
    res = check(entropy_ladder, _target_rows(3, 0.85, drop=0.30), None, now=0)
    d = warns(res.alerts, "drop_frac")
    assert [a.severity for a in d] == ["critical"]


# ------------------------------------------------------------------------------ trend


def _doc_with_band(half_rel):
    """A pre-registration on the truth whose band half-width is ``half_rel`` of the forecast."""
    doc = make_prereg(LAW, TARGET, eval_noise=0.0, created="2026-01-01T00:00:00Z")
    doc = json.loads(json.dumps(doc))
    for p in doc["forecast"]:
        p["lo"], p["hi"] = p["loss"] * (1 - half_rel), p["loss"] * (1 + half_rel)
    return doc


def _shifted(size, at, seed=40):
    return sy.make_run(TRUTH, TARGET, noise=NOISE, seed=seed, offset=0.0,
                       fault=sy.Fault("shift", at, size)).rows


def test_trend_better_is_info_and_worse_is_a_warning():
    doc = _doc_with_band(0.04)   # alert band (99%) +-6.3%: a 2.5% step stays inside
    better = check(doc, _shifted(-0.025, 0.5), None, now=0)
    tr = [a for a in better.alerts if a.kind == "trend"]
    assert [(a.severity, a.direction) for a in tr] == [("info", "better")]
    assert better.exit_code == 0
    worse = check(doc, _shifted(0.025, 0.5), None, now=0)
    tr = [a for a in worse.alerts if a.kind == "trend"]
    assert [(a.severity, a.direction) for a in tr] == [("warn", "worse")]
    assert 0.5 <= tr[0].fraction <= 0.55


def test_trend_threshold_follows_the_band_width_and_waits_for_a_quarter_of_the_run():
    # a 2.5% step is 1/4.8 of a +-12% band (the cpu hero's): below the 0.25 x half-width limit
    wide = check(_doc_with_band(0.12), _shifted(0.025, 0.5), None, now=0)
    assert [a for a in wide.alerts if a.kind == "trend"] == []
    # the same step at 15% of the run: the trend rule is silent until 25%, then its baseline
    # (mostly before the step) shows it
    early = check(_doc_with_band(0.04), _shifted(0.025, 0.15), None, now=0)
    tr = [a for a in early.alerts if a.kind == "trend"]
    assert WatchConfig().trend_after == 0.25
    assert len(tr) == 1 and 0.25 <= tr[0].fraction <= 0.3 and tr[0].direction == "worse"


# ------------------------------------------------------------------------------ rising


def test_rising_is_silent_on_healthy_noisy_runs_and_catches_a_loss_that_goes_up():
    """A healthy run's held-out loss falls (eval noise sd 0.003, ~0.1%): never 1% above its own
    minimum. A +3% step at 60% of the run puts the loss above its minimum at once (the truth
    falls far less than 3% between two evals there): 'rising' on the second eval after onset,
    whatever the (here very wide) forecast band says."""
    doc = _doc_with_band(0.5)   # a band too wide for the band and trend rules to see anything
    for seed in range(5):
        healthy = check(doc, sy.make_run(TRUTH, TARGET, noise=NOISE, seed=seed).rows, None,
                        now=0)
        assert warns(healthy.alerts) == [], seed
    evals = sorted({float(r["progress"]) for r in _shifted(0.03, 0.6)
                    if "eval_dropless/loss" in r})
    onset_evals = [g for g in evals if g >= 0.6]
    res = check(doc, _shifted(0.03, 0.6), None, now=0)
    rising = warns(res.alerts, "rising")
    assert len(rising) == 1 and rising[0].direction == "worse"
    assert rising[0].fraction == pytest.approx(onset_evals[1], abs=1e-6)
    assert warns(res.alerts, "trend") == [] and warns(res.alerts, "above_band") == []
