"""Pre-registration files: content, hash, write-once, verify naming the edit, amendment chains."""

import json
import os
import stat

import numpy as np
import pytest

from ladder.cli.main import main
from ladder.io import InputError, canonical_json, read_json
from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.predict.band import combine_band, estimate_eval_noise
from ladder.predict.forecast import Target, forecast, grid_fractions
from ladder.predict.prereg import make_prereg
from ladder.specs import LADDERS, resolve

TRUTH = sy.Truth()


def rung_name():
    return LADDERS["cpu"].target.name

LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)


def cpu_target():
    _, (rung,) = resolve(f"cpu:{rung_name()}")
    return Target.from_rung(rung)


def test_target_from_rung_uses_the_one_counter():
    t = cpu_target()
    _, (rung,) = resolve(f"cpu:{rung_name()}")
    assert t.compute == rung.compute() and t.params == rung.params.total
    assert t.active_params == rung.params.active and t.tokens == rung.tokens
    assert t.steps == rung.steps and list(t.eval_steps) == rung.eval_steps()
    # compute so far at fraction g is g x planned (the counter is linear in tokens)
    for g in (0.01, 0.37, 1.0):
        assert t.at(np.array([g]))["compute"][0] == pytest.approx(rung.compute(g * rung.tokens),
                                                                  rel=1e-12)




def test_forecast_grid_every_percent_and_eval_steps_and_final():
    t = cpu_target()
    g = grid_fractions(t)
    assert g[-1] == 1.0
    assert np.all(np.isin(np.round(np.arange(1, 101) / 100, 10), np.round(g, 10)))
    steps = set(np.rint(g * t.steps).astype(int).tolist())
    assert set(t.eval_steps) <= steps
    f = forecast(LAW, t, level=0.9, eval_noise=0.0)
    # the truth at the target's planned compute (known law, no fit)
    assert f.final["loss"] == pytest.approx(float(TRUTH.loss(t.compute, 1.0)))
    mid = np.argmin(np.abs(f.fraction - 0.5))
    assert f.loss[mid] == pytest.approx(float(TRUTH.loss(t.compute, f.fraction[mid])))


def test_band_combines_law_band_and_eval_noise_in_quadrature():
    # hand-computed: law half-width 0.03, eval sd 0.01, level 0.9 -> z = 1.6449
    lo, hi = combine_band([2.0], [1.97], [2.03], level=0.9, eval_noise=0.01)
    half = np.sqrt(0.03 ** 2 + (1.6448536 * 0.01) ** 2)
    assert lo[0] == pytest.approx(2.0 - half, rel=1e-6) and hi[0] == pytest.approx(2.0 + half)
    lo, hi = combine_band([2.0], [np.nan], [np.nan], level=0.9, eval_noise=0.01)
    assert np.isnan(lo[0]) and np.isnan(hi[0])  # missing stays missing, never zero width


def test_eval_noise_estimate_recovers_known_sigma():
    rng = np.random.default_rng(0)
    curves = []
    for _ in range(4):
        x = np.linspace(0.01, 1, 100)
        y = 2 + 0.5 * x ** -0.3 + rng.normal(0, 0.004, x.size)
        curves.append((x, y))
    est = estimate_eval_noise(curves)
    assert est.sigma == pytest.approx(0.004, rel=0.15)


def build(**kw):
    kw.setdefault("created", "2026-01-01T00:00:00+00:00")
    return make_prereg(LAW, cpu_target(), eval_noise=0.003, **kw)


def test_document_fields_and_hash(tmp_path):
    doc = build(data_tag="mix-a", requires={"train.z_loss": 1e-4})
    for key in ("schema", "target", "applicability", "metric", "law", "law_sha256", "forecast",
                "final", "band_level", "decision_rule", "created", "git_sha", "tool_version",
                "sha256"):
        assert key in doc, key
    assert doc["schema"] == "prereg/1"
    assert doc["applicability"]["data_tag"] == "mix-a"
    assert doc["applicability"]["require"] == {"train.z_loss": 1e-4}
    assert doc["decision_rule"]["parameters"]["k_consecutive"] == 3
    assert "consecutive evals" in doc["decision_rule"]["words"]
    assert set(doc["forecast"][0]) == {"fraction", "step", "tokens", "loss", "lo", "hi"}
    import hashlib
    body = {k: v for k, v in doc.items() if k != "sha256"}
    assert doc["sha256"] == hashlib.sha256(canonical_json(body)).hexdigest()
    p = pr.write_once(tmp_path / "p.json", doc)
    assert not (os.stat(p).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    assert pr.verify(p).ok


def test_existing_file_is_never_overwritten(tmp_path):
    p = tmp_path / "p.json"
    p.write_text("precious\n")
    with pytest.raises(InputError) as e:
        pr.write_once(p, build())
    assert e.value.exit_code >= 64 and "never overwritten" in str(e.value)
    assert p.read_text() == "precious\n"
    assert list(tmp_path.iterdir()) == [p]  # no temp file left behind


def tamper(path, fn):
    os.chmod(path, 0o644)
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("edit, named", [
    (lambda d: d["forecast"][40].__setitem__("hi", d["forecast"][40]["hi"] + 0.1), "forecast"),
    (lambda d: d["final"].__setitem__("loss", 1.0), "final"),
    (lambda d: d["decision_rule"]["parameters"].__setitem__("k_consecutive", 9), "decision_rule"),
    (lambda d: d["law"]["params"].__setitem__("E", 1.0), "law"),
])
def test_tampered_prereg_fails_verify_and_names_the_section(tmp_path, edit, named, capsys):
    p = pr.write_once(tmp_path / "p.json", build())
    tamper(p, edit)
    v = pr.verify(p)
    assert not v.ok and any(c.startswith(named) for c in v.changed)
    if named == "law":
        assert any("law_sha256" in x for x in v.problems)
    assert main(["verify", str(p)]) == 65
    assert "MODIFIED" in capsys.readouterr().out
    with pytest.raises(InputError):  # the watcher refuses it too
        pr.load(p)


def test_verify_ok_exit_zero(tmp_path, capsys):
    p = pr.write_once(tmp_path / "p.json", build())
    assert main(["verify", str(p)]) == 0
    assert "OK" in capsys.readouterr().out


def test_amend_chain(tmp_path):
    old = pr.write_once(tmp_path / "v1.json", build())
    before = old.read_bytes()
    with pytest.raises(InputError, match="reason"):
        pr.amendment(old, None)
    am = pr.amendment(old, "shortened to 60% of tokens, decay re-aimed")
    v2 = pr.write_once(tmp_path / "v2.json", build(amends=am, created="2026-02-01T00:00:00+00:00"))
    assert read_json(v2)["amends"]["sha256"] == read_json(old)["sha256"]
    am3 = pr.amendment(v2, "data mix changed at step 108k")
    v3 = pr.write_once(tmp_path / "v3.json", build(amends=am3, created="2026-03-01T00:00:00+00:00"))
    assert old.read_bytes() == before  # the old file is untouched
    chain = pr.resolve_chain(old)
    assert [lk.path for lk in chain.links] == [str(old), str(v2), str(v3)]
    assert "v3.json" in chain.describe() and "data mix" in chain.describe()
    assert read_json(v3)["amends"]["chain"] == [read_json(old)["sha256"], read_json(v2)["sha256"]]
    # a tampered newest amendment is skipped: the watcher follows v2 and says why
    tamper(v3, lambda d: d["final"].__setitem__("loss", 9.0))
    chain = pr.resolve_chain(old)
    assert chain.newest.path == str(v2) and "v3.json fails verification" in chain.describe()
    # amending a tampered file is refused
    with pytest.raises(InputError):
        pr.amendment(v3, "x")


def test_cli_preregister_refuses_existing_out_before_any_work(tmp_path, capsys):
    out = tmp_path / "p.json"
    out.write_text("{}")
    code = main(["preregister", str(tmp_path / "missing-law.json"), "--target", "cpu:x",
                 "--out", str(out)])
    assert code >= 64 and out.read_text() == "{}"
    assert "never overwritten" in capsys.readouterr().err


def test_cli_reason_without_amend_is_a_usage_error(tmp_path):
    assert main(["preregister", "law.json", "--target", "cpu:x", "--reason", "r",
                 "--out", str(tmp_path / "p.json")]) == 64


def test_predict_never_imports_jax():
    import subprocess
    import sys
    code = ("import sys; import ladder.cli.predict, ladder.predict.live, "
            "ladder.predict.sinks, "
            "ladder.sources, ladder.predict.forecast, ladder.predict.prereg, "
            "ladder.predict.watch; "
            "from ladder.cli.main import main; "
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]),
                         check=True)
    assert out.stdout.strip() == "False"
