"""Runs from another trainer through a key map (issue 24, item 2): `--keys levanter|marin|FILE`
on `fit` and `watch` maps levanter's names (throughput/total_tokens, throughput/total_gflops in
GFLOPs, run_progress, optim/learning_rate, parameter_count) to ours; a `.../wandb/latest-run` path
is a source. The same run under either set of names gives the same law and the same verdict."""

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.cli.main import main
from ladder.io import InputError
from ladder.sources.keymap import load_keymap, parse_keymap
from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.predict.prereg import make_prereg

TRUTH = sy.Truth()
LAW = sy.TruthLaw(TRUTH, run_sigma=0.005)


def levanter_row(r: dict, target) -> dict:
    """A metrics row as levanter logs it: its names, FLOPs in GFLOPs."""
    g = r["step"] / target.steps
    out = {"step": r["step"], "throughput/total_tokens": r["tokens"],
           "run_progress": r["progress"], "throughput/total_gflops": g * target.compute / 1e9,
           "optim/learning_rate": r["optim/lr"], "train/loss": r["train/loss"],
           "grad/norm": r["grad/norm"]}
    if "eval_dropless/loss" in r:
        out["eval/loss"] = r["eval_dropless/loss"]
    return out


def ramped(rows, target):
    """The rows of a run whose batch grows during training (tokens ~ step^1.2): where a row is
    in the run is its tokens, not its step."""
    out = []
    for r in rows:
        g = r["step"] / target.steps
        out.append(dict(r, tokens=target.tokens * g ** 1.2))  # run_progress: step / steps
    return out


def test_the_builtin_maps_name_levanters_keys():
    km = load_keymap("levanter")
    th = km.theirs
    assert th["tokens"] == ("throughput/total_tokens", 1.0)
    assert th["flops"] == ("throughput/total_gflops", 1e9)
    assert th["progress"] == ("run_progress", 1.0)
    assert th["optim/lr"] == ("optim/learning_rate", 1.0)
    assert th["params"] == ("parameter_count", 1.0)
    assert load_keymap("marin").theirs == th  # marin trains with levanter
    assert load_keymap(None) is None
    row = km.row({"throughput/total_gflops": 2.5, "run_progress": 0.5, "x": 1})
    assert row["flops"] == 2.5e9 and row["progress"] == 0.5 and row["x"] == 1
    assert km.row({"throughput/total_gflops": "NaN"})["flops"] == "NaN"


def test_bad_key_maps_are_one_line_errors(tmp_path):
    with pytest.raises(InputError, match="unknown key map 'nemo'") as e:
        load_keymap("nemo")
    assert e.value.exit_code == 64
    f = tmp_path / "k.toml"
    for text, field in (('[keys]\ntokens = 3\n', "keys.tokens"),
                        ('[keys]\nflops = {from = "g", scale = -1}\n', "keys.flops.scale"),
                        ('[keys]\nflops = {from = "g", factor = 2}\n', "keys.flops.factor"),
                        ('[keys]\nstep = "_step"\n', "keys.step"),
                        ('schema = "keymap/9"\n[keys]\na = "b"\n', "schema"),
                        ('[keys\n', None)):
        f.write_text(text)
        with pytest.raises(InputError) as e:
            load_keymap(str(f))
        assert str(f) in str(e.value) and "\n" not in str(e.value)
        if field:
            assert f"field '{field}'" in str(e.value)


names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names.filter(lambda k: k != "step"),
                       st.tuples(names, st.floats(1e-6, 1e12)), min_size=1, max_size=6))
def test_a_key_map_round_trips_and_maps_every_row(keys):
    theirs = [t for t, _ in keys.values()]
    obj = {"name": "x", "keys": {o: {"from": t, "scale": s} for o, (t, s) in keys.items()}}
    if len(set(theirs)) < len(theirs):
        with pytest.raises(ValueError, match="mapped twice"):
            parse_keymap(obj)
        return
    km = parse_keymap(obj)
    assert parse_keymap(km.to_dict()) == km
    row = {t: 2.0 for t in theirs}
    out = km.row(row)
    for o, (_, s) in keys.items():
        assert out[o] == pytest.approx(2.0 * s)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_watch_a_levanter_keyed_run_as_our_own(tmp_path, capsys):
    target = sy.ladder_targets(4, steps0=150)[-1]
    doc = make_prereg(LAW, target, eval_noise=0.003, created="2026-01-01T00:00:00Z")
    prereg = tmp_path / "prereg.json"
    pr.write_once(prereg, doc)
    rows = ramped(sy.make_run(TRUTH, target, seed=1, fault=sy.Fault("shift", 0.6, 0.03)).rows,
                  target)
    ours = _jsonl(tmp_path / "ours.jsonl", [
        {k: v for k, v in dict(r, **({"eval/loss": r["eval_dropless/loss"]}
                                     if "eval_dropless/loss" in r else {})).items()
         if k in ("step", "tokens", "progress", "optim/lr", "train/loss", "grad/norm",
                  "eval/loss")} for r in rows])
    theirs = _jsonl(tmp_path / "levanter.jsonl", [levanter_row(r, target) for r in rows])

    def verdict(*argv):
        capsys.readouterr()
        code = main(["watch", str(prereg), "--metric", "eval/loss", "--json", *argv])
        v = json.loads(capsys.readouterr().out)
        return code, v["worst"], v["evals"], [(a["kind"], a["severity"], a["fraction"])
                                              for a in v["alerts"]]
    want = verdict("--source", str(ours))
    assert want[0] == 2 and want[2] > 90  # the shift is caught
    assert verdict("--source", str(theirs), "--keys", "levanter") == want
    # without the map the watcher has no tokens: it places the rows by their step, elsewhere
    assert verdict("--source", str(theirs)) != want


def test_fit_a_levanter_keyed_table_as_our_own(tmp_path, capsys):
    pts = sy.points_table([sy.make_run(TRUTH, t, seed=i)
                           for i, t in enumerate(sy.ladder_targets(5, steps0=60))])
    pts.to_csv(tmp_path / "ours.csv", index=False)
    lev = pts.rename(columns={"tokens": "throughput/total_tokens", "fraction": "run_progress",
                              "params": "parameter_count"})
    lev["throughput/total_gflops"] = lev.pop("compute") / 1e9
    lev.to_csv(tmp_path / "lev.csv", index=False)

    from ladder.fit.points import load_points
    cols = ["params", "tokens", "compute", "fraction", "loss"]
    a = load_points([str(tmp_path / "ours.csv")])
    b = load_points([str(tmp_path / "lev.csv")], keymap=load_keymap("levanter"))
    assert list(a["run"]) == list(b["run"])
    assert np.allclose(a[cols].to_numpy(float), b[cols].to_numpy(float), rtol=1e-12)
    capsys.readouterr()
    assert main(["fit", str(tmp_path / "lev.csv"), "--keys", "levanter", "--form", "compute",
                 "--free-asymptote", "--bootstrap", "0", "--json", "--out", ""]) == 0
    law = json.loads(capsys.readouterr().out)
    assert law["conventions"]["metric_keys"]["name"] == "levanter"
    assert "throughput/total_gflops x 1e+09" in law["conventions"]["flops_source"]
    # without the map: no compute column
    assert main(["fit", str(tmp_path / "lev.csv"), "--form", "compute", "--out", ""]) == 65


@pytest.mark.slow  # four offline W&B runs (~15 s)
def test_a_levanter_keyed_offline_wandb_run_fitted_and_watched(tmp_path, monkeypatch, capsys):
    """Runs logged to W&B (offline) the way levanter logs them, named by their
    ``wandb/latest-run`` links: fitted with --keys levanter (the law of the same points as a
    table of ours), and the largest watched with --keys levanter (the verdict of the same rows
    under our names)."""
    import wandb
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    targets = sy.ladder_targets(4, steps0=60)
    runs = [sy.make_run(TRUTH, t, seed=i) for i, t in enumerate(targets)]
    for k, (t, run) in enumerate(zip(targets, runs)):
        d = tmp_path / f"r{k}"
        d.mkdir()
        w = wandb.init(project="lev", dir=str(d), name=t.name, reinit="finish_previous",
                       config={"trainer": {"num_train_steps": t.steps}})
        for r in run.rows:
            w.log({k2: v for k2, v in levanter_row(r, t).items() if k2 != "step"},
                  step=r["step"])
        w.summary["parameter_count"] = t.params
        w.finish()
    links = [str(tmp_path / f"r{k}" / "wandb" / "latest-run") for k in range(4)]
    assert all(os.path.islink(x) for x in links)

    pts = sy.points_table(runs)
    pts["loss"] = pts["loss"]  # eval/loss of the levanter rows = the dropless eval here
    pts.to_csv(tmp_path / "ours.csv", index=False)

    def law(*argv):
        capsys.readouterr()
        code = main(["fit", *argv, "--form", "compute", "--bootstrap", "20", "--json"])
        return code, json.loads(capsys.readouterr().out) if code == 0 else None
    code, got = law(*links, "--keys", "levanter", "--metric", "eval/loss", "--out",
                    str(tmp_path / "law.json"))
    assert code == 0
    _, want = law(str(tmp_path / "ours.csv"), "--out", "")
    for k in ("E", "A", "alpha"):
        assert got["params"][k] == pytest.approx(want["params"][k], rel=1e-6)
    capsys.readouterr()
    assert main(["fit", *links, "--metric", "eval/loss", "--form", "compute",
                 "--out", ""]) == 65  # without the map: no sizes, no FLOPs
    assert "--keys levanter" in capsys.readouterr().err  # the hint names the map, not --sizes

    hero = targets[-1]
    spec = tmp_path / "target.json"
    spec.write_text(json.dumps(hero.to_dict()))
    prereg = tmp_path / "prereg.json"
    assert main(["preregister", str(tmp_path / "law.json"), "--target-spec", str(spec),
                 "--eval-noise", "0.004", "--out", str(prereg), "-q"]) == 0
    ours = _jsonl(tmp_path / "hero.jsonl", [
        {"step": r["step"], "tokens": r["tokens"], "progress": r["progress"],
         "train/loss": r["train/loss"], "grad/norm": r["grad/norm"], "optim/lr": r["optim/lr"],
         **({"eval/loss": r["eval_dropless/loss"]} if "eval_dropless/loss" in r else {})}
        for r in runs[-1].rows])

    def verdict(*argv):
        capsys.readouterr()
        code = main(["watch", str(prereg), "--metric", "eval/loss", "--json", *argv])
        v = json.loads(capsys.readouterr().out)
        return code, v["evals"], v["last_step"], [(a["kind"], a["severity"], a["step"])
                                                  for a in v["alerts"]]
    want = verdict("--source", str(ours))
    got = verdict("--source", links[-1], "--keys", "levanter")
    assert got == want and got[1] == 100


def test_a_foreign_run_without_keys_is_told_which_map_reads_it():
    """Issue 38: a levanter-keyed W&B run fitted without --keys was told to give --sizes; its
    keys say which built-in map reads it. A run with no map's keys still gets --sizes."""
    from ladder.fit.points import points_from_histories
    from ladder.sources import WandbHistory
    from ladder.io import InputError
    t = sy.ladder_targets(3, steps0=60)[0]
    rows = [levanter_row(r, t) for r in sy.make_run(TRUTH, t, seed=0).rows]
    lev = WandbHistory(where="wandb://e/p/a", run_id="a", name="a", config={}, rows=rows,
                       summary={"parameter_count": t.params})
    with pytest.raises(InputError) as e:
        points_from_histories([lev], "eval/loss")
    assert e.value.field == "--keys" and "--keys levanter (or marin)" in str(e.value)
    assert "parameter_count" in str(e.value) and "--sizes" not in str(e.value)
    plain = WandbHistory(where="wandb://e/p/b", run_id="b", name="b", config={},
                         rows=[{"_step": 1, "loss": 3.0}])
    with pytest.raises(InputError, match="--sizes"):
        points_from_histories([plain], "loss")
