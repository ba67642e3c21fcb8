"""`ladder demo --out DIR` treats its folder as every command treats its --out (issue 39): it
claims it (.ladder-out.json), refuses with one line a file of its names that ladder did not write
there, adopts a folder an earlier demo wrote before the marker existed, and reuses a law.json only
when it is the demo's law and this version reads it; otherwise it fits again, with a one-line
note, instead of stopping at the law's reader."""

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import run_cli, write_law_runs

from ladder.cli import demo
from ladder.fit import load_law
from ladder.io import MARKER, InputError, marker_names

DATA = Path(__file__).parent / "data"
OTHER_LAW = DATA / "law_main_7de5265_compute.json"  # a `ladder fit` law: compute form


def test_a_new_folder_is_claimed_for_the_demos_files(tmp_path):
    out = demo.claim_demo_folder(tmp_path / "demo_out")
    assert set(demo.DEMO_FILES) <= set(marker_names(out))


def test_a_file_the_demo_did_not_write_is_refused_in_one_line(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "law.json").write_text('{"my": "notes"}')
    code, stdout, err = run_cli("demo", "--out", out, "--ladder", "tiny")
    assert code == 73 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "law.json" in err and MARKER in err
    assert (out / "law.json").read_text() == '{"my": "notes"}'


@pytest.mark.parametrize("what", ["law", "prereg", "run"])
def test_a_folder_an_earlier_demo_wrote_before_the_marker_is_adopted(tmp_path, what):
    out = tmp_path / "demo_out"
    if what == "law":
        out.mkdir()
        shutil.copy(OTHER_LAW, out / "law.json")
    elif what == "prereg":
        out.mkdir()
        (out / "prereg.json").write_text(json.dumps({"schema": "prereg/2"}))
    else:
        write_law_runs(out / "runs")
    assert demo.claim_demo_folder(out) == out and MARKER in os.listdir(out)


def test_a_law_json_that_is_not_the_demos_or_cannot_be_read_is_not_reused(tmp_path):
    law = tmp_path / "law.json"
    shutil.copy(OTHER_LAW, law)
    got, why = demo.reusable_law(law)
    assert got is None and why == (f"it is a compute law of eval/loss, not the demo's "
                                   f"{demo.FORM} law of {demo.METRIC}")
    law.write_text('{"schema": "law/3", "form": "trajectory-capac')  # cut short
    got, why = demo.reusable_law(law)
    assert got is None and why.startswith("it cannot be read (") and str(law) not in why
    doc = json.loads(OTHER_LAW.read_text())
    doc["uncertainty"]["intervals"] = "old"  # a field the reader takes for a mapping
    law.write_text(json.dumps(doc))
    got, why = demo.reusable_law(law)
    assert got is None and why.startswith("it cannot be read (")


@pytest.mark.heavy  # two trajectory-capacity fits: ~10 s on 2 busy cores
def test_fit_refits_over_a_law_json_it_cannot_use_then_reuses_its_own(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setattr(demo, "BOOTSTRAP", 0)  # the band is not what is tested here
    lad = write_law_runs(tmp_path / "runs")
    rungs = [tmp_path / "runs" / lad.name / r.name for r in lad.rungs]
    law = tmp_path / "law.json"
    law.write_text('{"schema": "law/1", "form": "trajectory"}')  # newer than the rungs
    got = demo._fit(law, rungs)
    out = capsys.readouterr().out
    assert f"[2/5] law: not reusing {law}: it cannot be read (" in out
    assert (got.form, got.metric) == (demo.FORM, demo.METRIC)
    assert load_law(law).form == demo.FORM
    before = law.read_bytes()
    again = demo._fit(law, rungs)
    assert f"law: reusing {law}" in capsys.readouterr().out
    assert law.read_bytes() == before and again.form == demo.FORM


def test_the_refusal_is_an_input_error_not_a_traceback(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "report").mkdir()  # someone's report folder
    with pytest.raises(InputError) as e:
        demo.claim_demo_folder(out)
    assert e.value.exit_code == 73 and e.value.field == "--out"


@pytest.mark.parametrize("text", ["[1, 2]", "3", '"files"', "null", '{"schema": 1}',
                                  "{not json"])
def test_a_marker_that_is_not_a_marker_object_lists_nothing(tmp_path, text):
    (tmp_path / MARKER).write_text(text)
    assert marker_names(tmp_path) == []
