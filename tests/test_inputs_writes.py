"""The input layer and the one place that writes (ladder.io): write-once is truly write-once,
modes, leftovers of killed writers, and the read errors that used to be tracebacks (issue 15)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ladder.cli.main import main
from ladder.io import (
    InputError,
    append_text,
    atomic_write_json,
    atomic_write_text,
    check_writable,
    iter_jsonl,
    number,
    read_json,
    read_metrics,
    read_table,
    staged_dir,
)
from ladder.predict import prereg as pr
from tests import synthetic as sy
from ladder.predict.prereg import make_prereg

TARGET = sy.ladder_targets(4, steps0=150)[-1]
LAW = sy.TruthLaw(sy.Truth(), run_sigma=0.005)


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture()
def prereg_path(tmp_path):
    return pr.write_once(tmp_path / "prereg.json", make_prereg(LAW, TARGET, eval_noise=0.003))


def test_fit_out_onto_a_preregistration_fails_73_and_leaves_it_intact(tmp_path, prereg_path,
                                                                      capsys):
    before = prereg_path.read_bytes()
    points = tmp_path / "points.csv"
    points.write_text("run,compute,loss\n" + "".join(
        f"r{i},{1e15 * 4 ** i},{1.6 + 40 * (1e15 * 4 ** i) ** -0.1}\n" for i in range(5)))
    code = main(["fit", str(points), "--form", "compute", "--bootstrap", "0",
                 "--out", str(prereg_path)])
    assert code == 73
    assert prereg_path.read_bytes() == before and mode(prereg_path) == 0o444
    out, err = capsys.readouterr()
    assert "prereg.json" in err and "read-only" in err
    assert "law:" not in out  # refused before the fit ran, not after
    assert pr.verify(prereg_path).ok


def test_no_atomic_write_replaces_a_read_only_file_even_as_root(tmp_path):
    p = tmp_path / "frozen.json"
    atomic_write_json(p, {"a": 1}, mode=0o444)
    for write in (lambda: atomic_write_json(p, {"a": 2}), lambda: atomic_write_text(p, "x")):
        with pytest.raises(InputError) as e:
            write()
        assert e.value.exit_code == 73 and "frozen.json" in str(e.value)
    assert json.loads(p.read_text()) == {"a": 1}
    assert not [q for q in tmp_path.iterdir() if q.name.endswith(".tmp")]


def test_modes_artifacts_0644_prereg_0444_appended_0644(tmp_path, prereg_path):
    old = os.umask(0o077)  # even under a strict umask: teammates read artifacts
    try:
        atomic_write_json(tmp_path / "law.json", {"schema": "law/1"})
        append_text(tmp_path / "alerts.jsonl", "{}\n")
    finally:
        os.umask(old)
    assert mode(tmp_path / "law.json") == 0o644
    assert mode(tmp_path / "alerts.jsonl") == 0o644
    assert mode(prereg_path) == 0o444


def test_temp_files_of_killed_writers_are_removed(tmp_path):
    """A writer killed between its temp file and the rename leaves ``.NAME.<pid>.*.tmp``; the next
    write of that name removes it, while a live writer's temp file is left alone."""
    target = tmp_path / "law.json"
    code = ("import os, sys; from ladder.io import atomic_write_bytes; "
            "os.replace = lambda *a: os._exit(9); "
            "atomic_write_bytes(sys.argv[1], b'x' * 1000)")
    r = subprocess.run([sys.executable, "-c", code, str(target)], cwd=Path(__file__).parents[1],
                       check=False)
    assert r.returncode == 9
    left = [q for q in tmp_path.iterdir() if q.name.startswith(".law.json.")]
    assert len(left) == 1 and not target.exists()
    live = tmp_path / f".law.json.{os.getppid()}.abc.tmp"  # a writer that is still running
    live.write_text("in flight")
    atomic_write_json(target, {"ok": True})
    names = sorted(q.name for q in tmp_path.iterdir())
    assert names == sorted([live.name, "law.json"])


def test_a_killed_report_leaves_the_old_report_whole(tmp_path):
    out = tmp_path / "report"
    own = ("index.html", "law.png")
    with staged_dir(out, own=own) as d:
        (d / "index.html").write_text("old")
        (d / "law.png").write_text("old")
    (out / "notes.txt").write_text("mine")  # not the report's: never touched
    with pytest.raises(RuntimeError), staged_dir(out, own=own) as d:
        (d / "index.html").write_text("new")
        raise RuntimeError("killed mid-report")
    assert (out / "index.html").read_text() == "old" and (out / "law.png").read_text() == "old"
    with staged_dir(out, own=own) as d:
        (d / "index.html").write_text("new")
    assert sorted(q.name for q in out.iterdir()) == [".ladder-out.json", "index.html",
                                                     "notes.txt"]  # stale PNG gone
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".report.")]


def test_check_writable_names_the_problem(tmp_path):
    (tmp_path / "afile").write_text("x")
    for bad in (tmp_path / "afile" / "sub" / "out.json", tmp_path):
        with pytest.raises(InputError) as e:
            check_writable(bad, field="--out")
        assert e.value.exit_code == 73
    assert check_writable(tmp_path / "new" / "deeper" / "out.json") is not None
    with pytest.raises(InputError, match="not a directory"):
        check_writable(tmp_path / "afile", directory=True)


@pytest.mark.parametrize("content,words", [
    (None, "is a directory"), (b"", "not valid JSON"), (b"\xff\xfe", "UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a": ' + b"9" * 5000 + b"}", "not valid JSON"), (b"[1, 2]", "JSON object")])
def test_read_json_errors_are_one_line_and_name_the_file(tmp_path, content, words):
    p = tmp_path / "x.json"
    if content is None:
        p.mkdir()
    else:
        p.write_bytes(content)
    with pytest.raises(InputError) as e:
        read_json(p)
    msg = str(e.value)
    assert "x.json" in msg and words in msg and "\n" not in msg


def test_metrics_readers_skip_what_they_cannot_use(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join([
        '{"step": 1, "loss": 3.0}', '{"step": ' + "9" * 5000 + "}", "[" * 50_000 + "]" * 50_000,
        '{"step": 1e30, "loss": 1.0}', '{"step": -3, "loss": 1.0}', '{"step": 2.5}',
        '{"step": true}', '{"step": 2, "loss": 2.9}', '{"step": 3, "lo']))
    notes: list = []
    got = read_metrics(p, notes=notes)
    assert [r["step"] for r in got] == [1, 2]
    assert "2 line(s) not a JSON object (first at line 2)" in notes[0]
    assert "4 row(s) without a valid step" in notes[0]
    assert len(list(iter_jsonl(p))) == 6  # the partial last line waits
    with pytest.raises(InputError, match="is a directory"):
        read_metrics(tmp_path)


def test_read_table_errors(tmp_path):
    (tmp_path / "d.csv").mkdir()
    (tmp_path / "bad.csv").write_bytes(b"a,b\n1,2,3,4\n\xff\xff")
    for name in ("d.csv", "bad.csv", "none.csv"):
        with pytest.raises(InputError) as e:
            read_table(tmp_path / name)
        assert name in str(e.value)


@pytest.mark.parametrize("value,kw,ok", [
    (0.5, {"lo": 0, "hi": 1, "lo_open": True, "hi_open": True}, True),
    (1.0, {"lo": 0, "hi": 1, "hi_open": True}, False), (float("nan"), {}, False),
    (float("inf"), {}, False), (10 ** 400, {}, False), (True, {}, False), ("3", {}, False),
    (3.0, {"integral": True}, True), (2.5, {"integral": True}, False), (None, {}, False),
    (None, {"allow_none": True}, True), (-1, {"lo": 0}, False)])
def test_number(value, kw, ok):
    if ok:
        number(value, field="f", **kw)
    else:
        with pytest.raises(InputError, match="field 'f'"):
            number(value, field="f", **kw)


def test_verify_calls_a_newer_schema_newer_not_modified(tmp_path, prereg_path, capsys):
    doc = json.loads(prereg_path.read_text())
    doc["schema"] = "prereg/4"   # prereg/2 (an amendment at a step, issue 27) and prereg/3 (several
    #                              metrics, issue 23) exist
    p = tmp_path / "v4.json"
    p.write_text(json.dumps(doc))
    assert main(["verify", str(p)]) == 65
    err = capsys.readouterr().err
    assert "newer" in err and "MODIFIED" not in err


def test_report_and_watch_refuse_a_tampered_preregistration(tmp_path, prereg_path, capsys):
    doc = json.loads(prereg_path.read_text())
    doc["final"]["loss"] = 1.0
    p = tmp_path / "edited.json"
    p.write_text(json.dumps(doc))
    m = tmp_path / "m.jsonl"
    m.write_text('{"step": 1, "train/loss": 3.0}\n')
    assert main(["report", "--prereg", str(p), "--out", str(tmp_path / "rep")]) == 65
    assert main(["watch", str(p), "--source", str(m)]) == 65
    err = capsys.readouterr().err
    assert err.count("edited.json") >= 2 and "final" in err
    assert not (tmp_path / "rep").exists()



def test_summary_escapes_names_from_files(tmp_path):
    from ladder.reports.build import build_report
    p = tmp_path / "p.json"
    p.write_text(json.dumps(pr.seal({
        "schema": "prereg/1", "target": {"name": "<script>alert(1)</script>"},
        "forecast": [{"fraction": 0.5, "loss": 3.0, "lo": 2.0, "hi": 4.0},
                     {"fraction": 1.0, "loss": 2.0, "lo": 1.5, "hi": 2.5}]})))
    build_report(tmp_path / "rep", prereg=p)
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "<script>" not in (tmp_path / "rep" / "index.html").read_text()


def test_schedule_inputs_that_would_hang_are_refused(tmp_path):
    from ladder.fit.lr_schedules import parse_schedule, read_schedule_csv
    with pytest.raises(InputError, match="steps"):
        parse_schedule("linear:steps=1e12,peak=1e-3")
    p = tmp_path / "s.csv"
    p.write_text("step,lr\n1,0.001\n1000000000000,0.0001\n")
    with pytest.raises(InputError, match="field 'step'"):
        read_schedule_csv(p)
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(InputError, match="d.csv"):
        read_schedule_csv(tmp_path / "d.csv")


def test_resume_cuts_back_a_metrics_file_with_poisoned_lines(tmp_path):
    """`run --resume` rewrites metrics.jsonl up to the checkpoint: a line with a 5000-digit
    integer or deep nesting (which crashed it) is dropped, and the file stays 0644."""
    from ladder.trainer.rundir import MetricsFile
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "train/loss": 3.0}\n{"step": ' + "9" * 5000 + "}\n"
                 + "[" * 50_000 + "]" * 50_000 + '\n{"step": 2, "train/loss": 2.9}\n'
                 '{"step": 3, "train/loss": 2.8}\n')
    MetricsFile(p).truncate_to(2)
    assert [json.loads(line)["step"] for line in p.read_text().splitlines()] == [1, 2]
    assert mode(p) == 0o644


# ------------------------------------------------------------------ issue 26 item 6


def test_an_append_after_a_partial_last_line_is_a_whole_line(tmp_path):
    """A full disk (or a kill) cut the last alert short; the next one is not glued onto it."""
    p = tmp_path / "alerts.jsonl"
    p.write_text('{"id": "a", "kind": "spike"}\n{"id": "b", "ki')
    cut = append_text(p, '{"id": "c", "kind": "nan"}\n')
    assert cut == len('{"id": "b", "ki')
    assert [json.loads(x)["id"] for x in p.read_text().splitlines()] == ["a", "c"]


def test_a_failed_append_leaves_no_partial_line(tmp_path, monkeypatch):
    import errno
    p = tmp_path / "alerts.jsonl"
    p.write_text('{"id": "a"}\n')
    real = os.write

    def half_then_full(fd, data):
        if len(data) > 4:
            real(fd, bytes(data[:4]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(InputError, match="no space left") as e:
        append_text(p, '{"id": "b", "kind": "nan"}\n')
    assert e.value.exit_code == 73
    monkeypatch.undo()
    assert p.read_text() == '{"id": "a"}\n'


def test_the_jsonl_sink_resends_an_alert_after_a_torn_write(tmp_path):
    from ladder.predict.sinks import JsonlSink
    from ladder.predict.watch import Alert
    p = tmp_path / "alerts.jsonl"
    p.write_text('{"time": "t", "kind": "na')  # torn: its id never reached the file
    a = Alert("t", 5, None, None, "nan", "critical", message="x")
    JsonlSink(p).send(a, {"id": "abc"})
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    assert [(r["id"], r["kind"]) for r in rows] == [("abc", "nan")]


@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_a_report_swap_killed_midway_never_loses_the_users_files(tmp_path, kill_at):
    """A kill (no cleanup: ``os._exit``) at the n-th rename of the swap; then the next report.
    The user's file in --out is never moved, and nothing a writer did not write is deleted."""
    out = tmp_path / "report"
    own = ("index.html", "law.png", "watch.png")
    with staged_dir(out, own=own) as d:
        for name in own:
            (d / name).write_text("old")
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "kept.md").write_text("mine too")
    code = ("import os, sys\n"
            f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
            "real, n = os.replace, [0]\n"
            "def replace(a, b):\n"
            "    real(a, b)\n"
            "    n[0] += 1\n"
            f"    if n[0] == {kill_at}:\n"
            "        os._exit(9)\n"
            "os.replace = replace\n"
            "from ladder.io import staged_dir\n"
            f"with staged_dir({str(out)!r}, own={own!r}) as d:\n"
            "    (d / 'index.html').write_text('new')\n"
            "    (d / 'law.png').write_text('new')\n")
    r = subprocess.run([sys.executable, "-c", code], check=False)
    assert r.returncode == 9
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "sub" / "kept.md").read_text() == "mine too"
    with staged_dir(out, own=own) as d:
        (d / "index.html").write_text("newer")
    assert sorted(q.name for q in out.iterdir()) == [".ladder-out.json", "index.html",
                                                     "notes.txt", "sub"]
    assert (out / "index.html").read_text() == "newer"
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".report.")]


def test_stale_directories_of_older_versions_are_left_alone(tmp_path):
    """The swap of older versions moved the user's files into ``.NAME.PID.*.tmp``: a killed one
    left them there, and they must not be deleted (issue 26)."""
    out = tmp_path / "report"
    old = tmp_path / ".report.999999999.abc.tmp"
    old.mkdir()
    (old / "notes.txt").write_text("mine")
    with staged_dir(out, own=("index.html",)) as d:
        (d / "index.html").write_text("new")
    assert (old / "notes.txt").read_text() == "mine"
