"""Issue 26 items 3 and 4: what the watcher trusts is what the user named (amendments recorded by
`preregister --amend` or named with --amend-chain; a file that merely appears is reported, not
followed; `verify --expect`; `report` says when the law drawn is not the registered one), and
our own files (the watch state, a token manifest) are checked field by field."""

from __future__ import annotations

import json
import shutil

import pytest

from ladder.cli.main import main
from ladder.io import InputError
from ladder.predict import prereg as pr


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from bench.fuzz_inputs import build_world
    return build_world(tmp_path_factory.mktemp("trust") / "world")


@pytest.fixture
def w(world, tmp_path):
    dst = tmp_path / "w"
    shutil.copytree(world, dst)
    return dst


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def forged(w, *, created="9999-01-01T00:00:00+00:00"):
    """A pre-registration sealed by hand beside the real one, claiming to amend it, with a band
    so wide that nothing is ever outside it."""
    doc = pr.load(w / "pre" / "prereg.json")
    d = {k: v for k, v in doc.items() if k not in ("sha256", "section_sha256")}
    d["amends"] = {"sha256": doc["sha256"], "path": "prereg.json", "reason": "forged",
                   "chain": [doc["sha256"]]}
    d["created"] = created
    d["forecast"] = [dict(p, lo=0.0, hi=100.0) for p in d["forecast"]]
    q = w / "pre" / "zz-forged.json"
    sealed = pr.seal(d)
    q.write_text(json.dumps(sealed))
    return q, sealed["sha256"]


# ------------------------------------------------------------------ item 3: trust by name


def test_a_hand_sealed_file_beside_the_prereg_is_reported_not_followed(w, capsys):
    q, sha = forged(w)
    code, out, err = cli(capsys, "watch", w / "pre" / "prereg.json", "--source",
                         w / "live.jsonl", "--json")
    verdict = json.loads(out)
    assert verdict["prereg_sha256"] == pr.load(w / "pre" / "prereg.json")["sha256"] != sha
    assert "zz-forged.json claims to amend it but is not recorded" in verdict["prereg"]
    code, out, _ = cli(capsys, "verify", w / "pre" / "prereg.json")
    assert code == 0 and "not followed: zz-forged.json" in out


def test_an_amendment_named_with_amend_chain_is_followed(w, capsys):
    q, sha = forged(w)
    code, out, _ = cli(capsys, "watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl",
                       "--json", "--amend-chain", q)
    assert json.loads(out)["prereg_sha256"] == sha


def test_preregister_amend_records_the_amendment_and_the_watcher_follows_it(w, capsys):
    v2 = w / "pre" / "v2.json"
    code, out, err = cli(capsys, "preregister", w / "law.json", "--target-spec",
                         w / "target.json", "--amend", w / "pre" / "prereg.json", "--reason",
                         "data mix changed", "--eval-noise", "0.003", "--out", v2)
    assert code == 0, err
    rec = [json.loads(x) for x in (w / "pre" / "amendments.jsonl").read_text().splitlines()]
    assert rec[-1]["file"] == "v2.json" and rec[-1]["sha256"] == pr.load(v2)["sha256"]
    code, out, _ = cli(capsys, "watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl",
                       "--json")
    assert json.loads(out)["prereg_sha256"] == pr.load(v2)["sha256"]
    # the recorded file replaced by one resealed by hand: its sha256 is not the recorded one
    doc = pr.load(v2)
    v2.chmod(0o644)
    v2.write_text(json.dumps(pr.seal(dict(doc, final=dict(doc["final"], hi=99.0)))))
    chain = pr.resolve_chain(w / "pre" / "prereg.json")
    assert chain.newest.path == str(w / "pre" / "prereg.json")
    assert "not the one recorded" in chain.describe()
    # an amendment goes beside the file it amends (where its record is)
    code, _, err = cli(capsys, "preregister", w / "law.json", "--target-spec", w / "target.json",
                       "--amend", w / "pre" / "prereg.json", "--reason", "x", "--out",
                       w / "elsewhere.json")
    assert code == 64 and "beside the file it amends" in err


def test_verify_expect_anchors_the_file_outside_itself(w, capsys):
    p = w / "pre" / "prereg.json"
    doc = pr.load(p)
    sha = doc["sha256"]
    code, out, _ = cli(capsys, "verify", p, "--expect", sha.upper())
    assert code == 0 and "expected" in out
    p.chmod(0o644)
    p.write_text(json.dumps(pr.seal(dict(doc, final=dict(doc["final"], hi=99.0)))))
    assert cli(capsys, "verify", p)[0] == 0            # a hash is not a signature ...
    code, out, _ = cli(capsys, "verify", p, "--expect", sha)  # ... an anchor outside is
    assert code == 65 and "NOT the expected" in out
    code, _, err = cli(capsys, "verify", p, "--expect", "abc")
    assert code == 64 and "--expect" in err


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_report_notes_a_law_other_than_the_registered_one(w, capsys):
    code, out, err = cli(capsys, "report", "--law", w / "law.json", "--prereg",
                         w / "pre" / "prereg.json", "--out", w / "rep")
    assert code == 0, err
    assert "not the one the pre-registration" not in (w / "rep" / "summary.md").read_text()
    doc = json.loads((w / "law.json").read_text())
    doc["fit"]["u"][0] += 0.05
    (w / "law2.json").write_text(json.dumps(doc))
    code, out, err = cli(capsys, "report", "--law", w / "law2.json", "--prereg",
                         w / "pre" / "prereg.json", "--out", w / "rep")
    assert code == 0, err
    assert "law2.json" in (w / "rep" / "summary.md").read_text()
    assert "not the one the pre-registration" in (w / "rep" / "summary.md").read_text()


def test_a_bad_chain_file_line_names_the_line(w):
    (w / "pre" / "amendments.jsonl").write_text(json.dumps(
        {"schema": pr.CHAIN_SCHEMA, "amends": "a" * 64, "sha256": "b" * 64,
         "file": "../../etc/passwd"}) + "\n" + '{"torn": ')
    with pytest.raises(InputError) as e:
        pr.resolve_chain(w / "pre" / "prereg.json")
    assert e.value.field == "line 1.file"


# ------------------------------------------------------------------ item 4: our own files


def state_of(w, capsys):
    st = w / "st.json"
    code, _, err = cli(capsys, "watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl",
                       "--state", st)
    assert code == 0, err
    return st


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["source"].__setitem__("offset", "__1e400__"), "source.offset"),
    (lambda d: d["source"].__setitem__("max_step", "x"), "source.max_step"),
    (lambda d: d["source"].__setitem__("inode", -5), "source.inode"),
    (lambda d: d.__setitem__("outbox", [{"id": "a", "pending": [["stdout"]],
                                        "alert": {"kind": "x", "severity": "info"}}]),
     "outbox[0]"),
    (lambda d: d["state"].__setitem__("worst", "bogus"), "state.worst"),
    (lambda d: d["state"].__setitem__("n_evals", "many"), "state.n_evals"),
    (lambda d: d["state"]["band"].__setitem__("run_len", -1), "state.band.run_len"),
    (lambda d: d["state"]["trend"].__setitem__("hist", [[1]]), "state.trend.hist"),
    (lambda d: d["state"].__setitem__("tails", []), "state.tails"),
    (lambda d: d["state"].__setitem__("surprise", 1), "state.surprise"),
    (lambda d: d.__setitem__("seq", -1), "seq"),
])
def test_a_damaged_state_file_is_one_line_naming_the_field_and_the_way_out(w, capsys, edit,
                                                                             field):
    st = state_of(w, capsys)
    doc = json.loads(st.read_text())
    edit(doc)
    st.write_text(json.dumps(doc).replace('"__1e400__"', "1e400"))
    code, _, err = cli(capsys, "watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl",
                       "--state", st)
    last = err.strip().splitlines()[-1]
    assert code == 65, last
    assert f"field '{field}'" in last and "move the state file aside" in last


def test_a_valid_state_is_taken_as_it_is(w, capsys):
    st = state_of(w, capsys)
    before = json.loads(st.read_text())
    code, _, err = cli(capsys, "watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl",
                       "--state", st)
    assert code == 0, err
    after = json.loads(st.read_text())
    assert after["state"]["n_points"] == before["state"]["n_points"]  # nothing judged again
    assert after["source"]["offset"] == (w / "live.jsonl").stat().st_size


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.__setitem__("splits", []), "splits"),
    (lambda m: m["splits"]["train"]["shards"][0].__setitem__("file", 123),
     "splits.train.shards[0].file"),
    (lambda m: m["splits"]["train"]["shards"][0].__setitem__("tokens", -1),
     "splits.train.shards[0].tokens"),
    (lambda m: m["splits"]["train"].__setitem__("shards", {"a": 1}), "splits.train.shards"),
    (lambda m: m.__setitem__("dtype", "float64"), "dtype"),
    (lambda m: m.__setitem__("eos_id", 10 ** 9), "eos_id"),
    (lambda m: m.__setitem__("vocab_size", "x"), "vocab_size"),
    (lambda m: m.__setitem__("tokenizer", []), "tokenizer"),
])
def test_a_damaged_token_manifest_is_one_line_naming_the_field(w, edit, field):
    from ladder.trainer.tokens import load_shards
    m = w / "shards" / "manifest.json"
    doc = json.loads(m.read_text())
    edit(doc)
    m.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        load_shards(w / "shards")
    assert e.value.field == field and "ladder tokenize" in str(e.value)
    assert e.value.exit_code == 65
