"""An amendment at step S (issue 27 item 2): the forecast before S is the old one, carried
unchanged; from S on it is anchored on the run and moved by the change's evidence; the watcher
follows it from S on and says so; a declared change of data tag no longer stops the watch, an
undeclared one still does; old pre-registrations keep reading; bad --at-step values are refused.

The run is synthetic with a known truth (tests/synthetic.py): the target of the watcher tests,
which switches at S = 30% of its steps to a recipe worth ``M`` times the compute, i.e. from S on
each unit of compute counts M times (its loss is the truth at the effective compute)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from helpers import run_cli, watch_world

from ladder.io import InputError, read_json
from ladder.predict import prereg as pr
from ladder.cli.predict import at_step_prereg, watch_verdict
from ladder.predict.live import Watcher
from ladder.predict.prereg import make_prereg
from ladder.sources import open_source

M_TRUE = 2.0
METRIC = "eval_dropless/loss"


def switching_rows(M: float, S: int, *, tags=("A", "B"), seed: int = 0) -> list[dict]:
    """An eval every 1% of the target's run; from step S each unit of compute counts M times;
    the run's configuration (its data tag) is logged at the first row and again after S."""
    truth, target, _, noise = watch_world()
    rng = np.random.default_rng(seed)
    fs = S / target.steps
    rows = []
    for i in range(1, 101):
        st = int(round(i / 100 * target.steps))
        f = st / target.steps
        eff = min(f, fs) + M * max(f - fs, 0.0)
        loss = float(truth.loss(target.compute * eff / f, f) + rng.normal(0, noise.eval_sigma))
        rows.append({"step": st, "progress": f, "tokens": f * target.tokens, METRIC: loss})
    rows[0]["config"] = {"data_tag": tags[0]}
    first_after = next(r for r in rows if r["step"] > S)
    first_after["config"] = {"data_tag": tags[1]}
    return rows


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def args_for(old, run, S, **kw):
    d = {"amend": str(old), "reason": "data mixture B from 30%", "at_step": S,
         "source": str(run), "multiplier": "2.0:1.6:2.5", "compare": None, "seq_len": None,
         "data_tag": "B", "transition": "compute", "law": None, "target": None,
         "target_spec": None, "level": None, "eval_noise": None}
    d.update(kw)
    return argparse.Namespace(**d)


@pytest.fixture()
def world(tmp_path):
    """(old prereg path, amendment path, S, target) with the amendment written at S from the
    run's evals up to S."""
    _, target, law, _ = watch_world()
    old = pr.write_once(tmp_path / "prereg.json",
                        make_prereg(law, target, eval_noise=0.003, data_tag="A"))
    S = int(0.3 * target.steps)
    run = write(tmp_path / "upto_S.jsonl", [r for r in switching_rows(M_TRUE, S)
                                            if r["step"] <= S])
    a = args_for(old, run, S)
    doc = at_step_prereg(a, pr.amendment(old, a.reason), law=law)
    new = pr.write_once(tmp_path / "prereg-B.json", doc)
    return old, new, S, target


def watch(prereg, rows, path):
    w = Watcher(prereg, open_source(str(write(path, rows))), [], None)
    return watch_verdict(w, w.run())


def test_the_amendment_carries_the_old_forecast_before_S_and_is_prereg_2(world):
    old, new, S, target = world
    o, n = read_json(old), read_json(new)
    assert o["schema"] == "prereg/1" and n["schema"] == "prereg/2"
    assert pr.verify(new).ok and pr.verify(old).ok
    before = [r for r in o["forecast"] if r["step"] < S]
    carried = [r for r in n["forecast"] if r.get("carried")]
    assert [(r["loss"], r["lo"], r["hi"]) for r in before] == \
        [(r["loss"], r["lo"], r["hi"]) for r in carried]
    after = [r for r in n["forecast"] if not r.get("carried")]
    assert after[0]["step"] == S and all(r["step"] >= S for r in after)
    # the band's two parts are registered apart, each inside the whole
    for r in after:
        assert r["lo"] <= min(r["lo_law"], r["lo_change"]) <= r["loss"]
        assert r["hi"] >= max(r["hi_law"], r["hi_change"]) >= r["loss"]
    ch = n["change"]
    assert ch["at_step"] == S and ch["data_tag"] == {"before": "A", "after": "B"}
    assert 0 < ch["final_band_share_of_change"] < 1
    # no jump at S: the amended forecast at S is the run's anchor, within the anchor's noise
    anchor = ch["anchor"]["values"][-1]
    assert abs(after[0]["loss"] / anchor - 1) < 0.005


def test_the_watch_follows_the_amendment_from_S_and_says_so(world, tmp_path):
    old, new, S, target = world
    rows = switching_rows(M_TRUE, S, seed=1)
    v = watch(old, rows, tmp_path / "run.jsonl")   # the chain file beside old records new
    assert v["exit"] == 0 and v["not_applicable"] is None, v
    assert v["follows_from_step"] == S
    assert f"from step {S}" in v["prereg"] and "prereg-B.json" in v["prereg"]
    assert v["evals"] == 100
    # the old forecast alone: the declared tag change is still a change it does not cover
    v_old = watch(pr.load(old), rows, tmp_path / "run_old.jsonl")
    assert v_old["exit"] == 3 and "data_tag is 'B'" in v_old["not_applicable"]


def test_an_undeclared_change_still_stops_the_watch(world, tmp_path):
    old, _, S, _ = world
    v = watch(old, switching_rows(M_TRUE, S, tags=("A", "C")), tmp_path / "run.jsonl")
    assert v["exit"] == 3 and "data_tag is 'C'" in v["not_applicable"]


def test_after_S_the_amended_forecast_is_judged(world, tmp_path):
    """A run on which the new data did nothing (M = 1) lies above the amended forecast, which
    expected M = 2 [1.6, 2.5]: the alerts come after S, none before."""
    old, _, S, _ = world
    v = watch(old, switching_rows(1.0, S), tmp_path / "run.jsonl")
    judged = [a for a in v["alerts"] if a["kind"] not in ("prereg", "input")]
    assert v["exit"] in (1, 2) and judged, v
    assert min(a["step"] for a in judged) > S
    assert any(a["kind"] == "above_band" for a in judged)


def test_a_resealed_carried_row_is_refused(world, tmp_path):
    old, new, S, _ = world
    doc = read_json(new)
    row = next(r for r in doc["forecast"] if r.get("carried"))
    row["hi"] = row["hi"] * 1.5
    doc = pr.seal(doc)
    new.chmod(0o644)
    new.write_text(json.dumps(doc))
    # the chain file records the old sha256: re-record the resealed file under its new one
    chain = new.parent / pr.CHAIN_FILE
    rec = json.loads(chain.read_text().splitlines()[-1])
    rec["sha256"] = doc["sha256"]
    chain.write_text(json.dumps(rec) + "\n")
    with pytest.raises(InputError, match="carried row"):
        Watcher(old, open_source(str(write(tmp_path / "r.jsonl", switching_rows(2.0, S)))),
                [], None)


def test_old_preregistrations_still_read(prereg_path, tmp_path):
    doc = read_json(prereg_path)
    assert doc["schema"] == "prereg/1" and "change" not in doc
    assert pr.verify(prereg_path).ok and pr.load(prereg_path)["sha256"] == doc["sha256"]
    # a prereg/2 file must hold a change section, and only it does
    bad = pr.seal({**doc, "schema": "prereg/2"})
    v = pr.verify_doc(bad)
    assert not v.ok and any("change section" in p for p in v.problems)


@pytest.fixture(scope="module")
def cli_world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    _, target, law, _ = watch_world()
    old = pr.write_once(tmp / "prereg.json",
                        make_prereg(law, target, eval_noise=0.003, data_tag="A"))
    S = int(0.3 * target.steps)
    run = write(tmp / "run.jsonl", [r for r in switching_rows(M_TRUE, S) if r["step"] <= S])
    empty = tmp / "empty.jsonl"
    empty.write_text('{"step": 1, "train/loss": 3.0}\n')
    return old, run, target, empty


def refused(old, args, code, field):
    """`ladder preregister --amend OLD ...ARGS` exits ``code``, its error (the last line: a usage
    error prints the usage first) names ``field``, and nothing is written."""
    out = old.parent / "new.json"   # beside OLD, as an amendment must be
    code_, _, err = run_cli("preregister", "--amend", old, "--reason", "mix B", *args,
                            "--out", out)
    assert code_ == code, (args, err)
    lines = err.strip().splitlines()
    assert field in lines[-1], (args, err)
    if code_ != 64 or "usage:" not in err:
        assert len(lines) == 1, err
    assert not out.exists()


def test_bad_at_step_values_are_refused(cli_world, tmp_path):
    old, run, target, _ = cli_world
    for step in ["0", "-3", "1.5", "x", str(target.steps), str(target.steps + 5)]:
        refused(old, ["--at-step", step, "--source", run, "--data-tag", "B",
                                "--multiplier", "2"], 64, "--at-step")
    # --at-step without --amend
    code, _, err = run_cli("preregister", "--at-step", "360", "--source", run,
                           "--multiplier", "2", "--out", tmp_path / "new.json")
    assert code == 64 and "--amend" in err


def test_bad_changes_are_refused(cli_world, tmp_path):
    old, run, _, empty = cli_world
    base = ["--at-step", "360", "--source", run]
    for extra, field, code in [
            ([], "--at-step", 64),                                  # nothing changes
            (["--data-tag", "B"], "--data-tag", 64),                # a tag without evidence
            (["--data-tag", "A", "--multiplier", "2"], "--data-tag", 64),  # the registered tag
            (["--multiplier", "2:3:4"], "--multiplier", 64),        # M outside its interval
            (["--multiplier", "-1"], "--multiplier", 64),
            (["--multiplier", "2", "--source", empty], "--source", 65),  # no eval up to S
            (["--compare", empty], "--compare", 65),                # not a compare file
            (["--multiplier", "2", "--level", "0.8"], "--level", 64)]:  # not the carried level
        refused(old, base + extra, code, field)


def test_at_step_options_without_at_step_are_refused(tmp_path, prereg_path):
    code, _, err = run_cli("preregister", "--amend", prereg_path, "--reason", "x",
                           "--multiplier", "2", "--out", tmp_path / "new.json")
    assert code == 64 and "--multiplier" in err


@pytest.mark.parametrize("transition", ["compute", "recipe", "relax"])
def test_every_transition_starts_at_the_anchor_and_keeps_the_old_rows(tmp_path, transition):
    """No jump at S whichever transition: the amended curve at S is the run's anchor (within
    the anchor's own noise); the rows before S are the old ones."""
    from ladder.predict.amend import Plan, amended_forecast, parse_multiplier
    _, target, law, _ = watch_world()
    old = make_prereg(law, target, eval_noise=0.003, data_tag="A")
    S = int(0.3 * target.steps)
    rows = [r for r in switching_rows(M_TRUE, S) if r["step"] <= S]
    ev = (np.array([r["step"] for r in rows]), np.array([r[METRIC] for r in rows]))
    body = amended_forecast(old, law, target, Plan(S, parse_multiplier("2:1.6:2.5"), "B"), ev,
                            level=0.9, eval_noise=0.003, transition=transition, width=0.05)
    after = [r for r in body["forecast"] if not r.get("carried")]
    assert after[0]["step"] == S and abs(after[0]["loss"] / ev[1][-1] - 1) < 0.005
    assert len([r for r in body["forecast"] if r.get("carried")]) == \
        len([r for r in old["forecast"] if r["step"] < S])
    # the new recipe is worth more compute: the amended curve ends below the old one (not
    # "recipe": shifting the new recipe's whole curve to the anchor gives back what it gained
    # before S, and its slope alone is left)
    if transition != "recipe":
        assert body["final"]["loss"] < old["final"]["loss"]
    assert body["change"]["transition"] == transition


def test_a_declared_sequence_length_change(tmp_path):
    """--seq-len: the tokens after S count k = new/old times (no multiplier given: the longer
    context's own effect is not measured), rows map to the forecast by step, and a run
    configuration with either length is accepted, a third one is not."""
    truth, target, law, _ = watch_world()
    old = pr.write_once(tmp_path / "prereg.json",
                        make_prereg(law, target, eval_noise=0.003, data_tag="A"))
    S = int(0.3 * target.steps)
    rows = switching_rows(2.0, S)                  # twice the tokens per step after S
    run = write(tmp_path / "upto_S.jsonl", [r for r in rows if r["step"] <= S])
    a = args_for(old, run, S, multiplier=None, data_tag=None, seq_len=2 * target.seq_len)
    doc = at_step_prereg(a, pr.amendment(old, a.reason), law=law)
    pr.write_once(tmp_path / "prereg-long.json", doc)
    assert doc["target"]["seq_len"] == 2 * target.seq_len
    assert doc["decision_rule"]["parameters"]["align"] == "step"
    assert doc["change"]["seq_len_ratio"] == 2.0 and doc["change"]["multiplier"]["value"] == 1
    assert doc["final"]["loss"] < read_json(old)["final"]["loss"]
    for r in rows:   # the rows count the tokens of the run as it went
        r.pop("config", None)
        r["tokens"] = target.tokens / target.steps * (min(r["step"], S)
                                                     + 2 * max(r["step"] - S, 0))
    rows[0]["config"] = {"seq_len": target.seq_len, "data_tag": "A"}
    nxt = next(r for r in rows if r["step"] > S)
    nxt["config"] = {"seq_len": 2 * target.seq_len, "data_tag": "A"}
    v = watch(old, rows, tmp_path / "run.jsonl")
    assert v["not_applicable"] is None and v["follows_from_step"] == S and v["evals"] == 100
    nxt["config"] = {"seq_len": 3 * target.seq_len, "data_tag": "A"}
    v = watch(old, rows, tmp_path / "run3.jsonl")
    assert v["exit"] == 3 and "seq_len is" in v["not_applicable"]
