"""The one shape of a watcher source and of a sink (ladder.sources.base.Source,
ladder.predict.sinks.Sink): what the watcher may rely on without probing; and read positions written
before the sources were split into a package still restoring."""

from __future__ import annotations

import hashlib
import json
import os

from helpers import watch_rows as rows  # the watched target's run; prereg_path: conftest
from helpers import write_jsonl

from ladder.sources.keymap import load_keymap
from ladder.predict.live import Watcher
from ladder.predict.sinks import Sink
from ladder.sources import (
    CsvSource,
    JsonlSource,
    KeyMappedSource,
    Poll,
    Source,
    WandbApiSource,
    WandbOfflineSource,
    open_source,
)


class Rows(Source):
    """A source that has nothing but ``poll``: every other part is the shape's default."""

    kind = "rows"

    def __init__(self, rows):
        self.left = list(rows)

    def poll(self) -> Poll:
        got, self.left = self.left[:50], self.left[50:]
        return Poll(rows=got, more=bool(self.left))


class Taken(Sink):
    """A sink that has nothing but ``send``."""

    def __init__(self):
        self.ids = []

    def send(self, alert, context):
        self.ids.append(context["id"])


def test_a_source_and_a_sink_with_one_method_each_are_watched(tmp_path, prereg_path):
    run = rows("shift", at=0.5)
    src, sink = Rows(run), Taken()
    assert src.finished() is None and src.poll_seconds == 1.0
    w = Watcher(prereg_path, src, [sink], tmp_path / "state.json")
    alerts = w.poll()
    assert w.state["n_points"] == len(run)  # every row judged, in polls of 50
    assert any(a.kind == "above_band" for a in alerts)  # the shift is caught
    assert len(sink.ids) == len(alerts) and sink.name == "Taken"
    # the same rows through the JSONL source: the same verdict, alert for alert
    write_jsonl(tmp_path / "m.jsonl", run)
    w2 = Watcher(prereg_path, JsonlSource(tmp_path / "m.jsonl"), [], None)
    assert [(a.kind, a.step) for a in w2.poll()] == [(a.kind, a.step) for a in alerts]
    assert w.run() == w2.exit_code  # run() closes the sinks: a no-op by default


def test_wrappers_forward_what_they_do_not_change(tmp_path):
    write_jsonl(tmp_path / "m.jsonl", [{"step": 1, "train/loss": 3.0}])
    inner = JsonlSource(tmp_path / "m.jsonl")
    for w in (KeyMappedSource(inner, load_keymap("levanter")),):
        assert (w.kind, w.poll_seconds, w.path) == ("jsonl", 1.0, inner.path)
        assert w.position() == inner.position() and w.finished() is None
    (tmp_path / "summary.json").write_text(json.dumps({"schema": "run-summary/1",
                                                       "status": "complete"}))
    assert KeyMappedSource(inner, None).finished() == "summary.json status complete"


def test_a_key_mapped_csv_gives_the_same_rows_by_either_poll(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("step,throughput/total_tokens,train/loss\n1,100,3.0\n2,200,2.9\n")
    km = load_keymap("levanter")
    by_rows = KeyMappedSource(CsvSource(p), km).poll().rows
    by_batch = KeyMappedSource(CsvSource(p), km).poll_batch(["tokens", "train/loss"], None)
    assert by_batch.batch is None and by_batch.rows == by_rows  # the watcher makes the columns
    assert [(r["step"], r["tokens"]) for r in by_rows] == [("1", "100"), ("2", "200")]


def _identity(path) -> dict:
    """A file's identity as the watcher has written it since issue 26 (device, inode, size, the
    sha256 of its first 4096 bytes): computed here, not by the code under test."""
    st = os.stat(path)
    first = path.read_bytes()[:4096]
    return {"dev": st.st_dev, "inode": st.st_ino, "size": st.st_size, "n": len(first),
            "first": hashlib.sha256(first).hexdigest()}


def test_positions_written_before_the_package_restore(tmp_path):
    """Read positions in the form predict/sources.py wrote them (main 7de5265), one per kind of
    source: each source continues where it stopped, nothing read twice (a moved JSONL is
    recognised by its first bytes)."""
    first, later = [{"step": s, "train/loss": 3.0 - s / 100} for s in (1, 2)], \
        [{"step": 3, "train/loss": 2.97}]
    old = tmp_path / "old.jsonl"
    write_jsonl(old, first)
    size, head = old.stat().st_size, old.read_text().splitlines(keepends=True)[0]
    pos = {"kind": "jsonl", "path": str(old), "offset": size, "inode": old.stat().st_ino,
           "line_no": 2, "max_step": 2, "config_sent": True, "head": head,
           "skip_through": None, "identity": _identity(old)}
    new = tmp_path / "moved.jsonl"
    old.rename(new)
    write_jsonl(new, later, mode="a")
    src = JsonlSource(new)
    src.restore(json.loads(json.dumps(pos)))
    got = src.poll_batch(["train/loss"], None)
    assert got.batch.step.tolist() == [3]
    assert any("moved" in n for n in got.notes)

    csv = tmp_path / "m.csv"
    csv.write_text("step,train/loss\n1,3.0\n2,2.9\n")
    pos = {"kind": "csv", "path": str(csv), "n_rows": 2, "size": csv.stat().st_size,
           "identity": _identity(csv)}
    with open(csv, "a") as f:
        f.write("3,2.8\n")
    src = CsvSource(csv)
    src.restore(pos)
    assert [r["step"] for r in src.poll().rows] == ["3"]

    wb = tmp_path / "run-x.wandb"
    wb.write_bytes(b":W&B\xbe\xe7\x00")  # a header, no record yet
    src = WandbOfflineSource(wb)
    src.restore({"kind": "wandb-offline", "path": str(wb), "config_sent": True,
                 "segments": {"run-x.wandb": {"offset": 7, "num": 4, "exit": True}}})
    assert src.segs == {"run-x.wandb": {"offset": 7, "num": 4, "exit": True}}
    assert src.finished() == "W&B exit record" and src.poll().rows == []

    api = WandbApiSource("wandb://e/p/a,b", api=object())
    api.restore({"kind": "wandb-api", "uri": ["a", "b"], "last_step": {"b": 41},
                 "done_ids": ["a"], "config_sent": True})
    assert (api.last_step, api.done_ids) == ({"b": 41}, ["a"])
    assert open_source(str(tmp_path / "later"), follow=True).path == \
        tmp_path / "later" / "metrics.jsonl"


class FakeWandb:
    """wandb as far as the alert sink uses it: ``init`` gives a run whose ``alert`` records (or,
    with ``fail``, raises as an unreachable server does)."""

    class AlertLevel:
        INFO, WARN, ERROR = "INFO", "WARN", "ERROR"

    def __init__(self, fail: bool = False):
        self.fail, self.got, self.inits = fail, [], 0

    def init(self, **kw):
        self.inits += 1
        return self

    def alert(self, title, text, level):
        if self.fail:
            raise RuntimeError("server down")
        self.got.append((title, text, level))


def test_the_wandb_alert_sink_sends_at_the_level_and_stops_after_a_failure(capsys):
    from ladder.predict.sinks import WandbAlertSink
    from ladder.predict.watch import Alert
    warn = Alert("t", 10, None, 0.5, "above_band", "warn", message="high")
    info = Alert("t", 11, None, 0.5, "cleared", "info", message="back")
    wb = FakeWandb()
    sink = WandbAlertSink("e", "p", "run1", wandb_module=wb)
    sink.send(info, {})
    sink.send(warn, {})
    assert wb.got == [("run1: above_band (warn)", "high", "WARN")] and not sink.failed
    down = FakeWandb(fail=True)
    sink = WandbAlertSink("e", "p", "run1", wandb_module=down)
    sink.send(warn, {})
    sink.send(warn, {})  # skipped: W&B failed once
    assert sink.failed and down.inits == 1
    err = capsys.readouterr().err
    assert err.count("wandb.alert failed (RuntimeError: server down)") == 1
