"""The column cache (predict.column_cache): a watcher started again without its state replays
the polls it made before instead of parsing them, with the same batches, notes, offsets and
verdict as parsing the file; an appended, truncated, rewritten, rotated or torn file, a cache it
cannot write or a cache entry that is damaged are all read from the file again."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from predict import column_cache
from predict import prereg as pr
from predict import synthetic as sy
from predict.commands import make_prereg
from predict.live import Watcher
from predict.sources import JsonlSource
from predict.watch import watched_keys

KEEP, KEYS = watched_keys("eval/loss")
TRUTH = sy.Truth()
TARGET = sy.ladder_targets(4, steps0=150)[-1]
NOISE = sy.RunNoise(run_sigma=0.005, eval_sigma=0.003)


def _lines(n0: int, n1: int, *, bad_at=()) -> str:
    out = []
    for s in range(n0, n1):
        if s in bad_at:
            out.append('{"step": %d, "train/loss": 2.' % s)  # a corrupt line
            continue
        r = {"step": s, "tokens": 1000.5 * s, "train/loss": round(3 + 1 / s, 6),
             "grad/norm": round(0.3 + 1e-3 * (s % 7), 6), "params/norm/embed": 10.0 + s * 1e-4,
             "flops": 6.1e18 * s}
        if s % 50 == 0:
            r["eval/loss"] = round(3.1 + 1 / s, 6)
        if s == 77:
            r["config"] = {"seq_len": 128, "lr": 1e-3}
        out.append(json.dumps(r))
    return "".join(line + "\n" for line in out)


def _source(path, cache=True, cache_dir=None):
    s = JsonlSource(path, max_rows=40)
    s.chunk_bytes = 1024  # ~6 lines a chunk, ~7 chunks a poll: many polls, many entries
    s.cache, s.cache_dir = cache, cache_dir
    return s


def _polls(path, **kw):
    """Every poll of a fresh source until it has nothing more, with the source's position."""
    s = _source(path, **kw)
    out = []
    while True:
        p = s.poll_batch(KEYS, KEEP, parallel=False)
        out.append((p, (p.notes, p.more, s.offset, s.line_no, s.max_step)))
        if not p.more:
            return out, s


def _same(a, b):
    assert len(a) == len(b)
    for (pa, ka), (pb, kb) in zip(a, b, strict=True):
        assert ka == kb
        x, y = pa.batch, pb.batch
        assert np.array_equal(x.step, y.step) and x.step.dtype == y.step.dtype
        assert sorted(x.cols) == sorted(y.cols) and sorted(x.nonfinite) == sorted(y.nonfinite)
        for k in x.cols:  # to the bit
            assert np.array_equal(x.cols[k].view(np.uint64), y.cols[k].view(np.uint64)), k
        for k in x.nonfinite:
            assert np.array_equal(x.nonfinite[k], y.nonfinite[k]), k
        assert x.configs == y.configs and x.notes == y.notes and pa.configs == pb.configs


def _replays(monkeypatch):
    hits = []
    real = column_cache.ColumnCache.lookup

    def lookup(self, *a, **kw):
        got = real(self, *a, **kw)
        hits.append(got is not None)
        return got
    monkeypatch.setattr(column_cache.ColumnCache, "lookup", lookup)
    return hits


def test_replay_equals_parsing_and_reads_only_the_tail(tmp_path, monkeypatch):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(1, 600, bad_at=(130, 131, 402)) + '{"step": 600, "train/lo')  # torn
    parsed, _ = _polls(p, cache=False)
    first, _ = _polls(p)
    _same(first, parsed)
    hits = _replays(monkeypatch)
    again, _ = _polls(p)
    _same(again, parsed)
    assert sum(hits) == len(parsed) - 1  # every poll but the last (it ended at the file's end)
    assert any("not a JSON object" in n for q, _ in again for n in q.notes)
    # the torn line completed and more appended: the cached polls replay, the rest is parsed
    with open(p, "a") as f:
        f.write('ss": 3.0}\n' + _lines(601, 900))
    hits.clear()
    grown, _ = _polls(p)
    _same(grown, _polls(p, cache=False)[0])
    assert sum(hits) == len(parsed) - 1


@pytest.mark.parametrize("change", ["truncate", "rewrite", "rotate", "head"])
def test_a_changed_file_is_read_again(tmp_path, monkeypatch, change):
    p = tmp_path / "metrics.jsonl"
    text = _lines(1, 600)
    p.write_text(text)
    _polls(p)
    if change == "truncate":  # to the middle of the cached polls, then other lines after it
        cut = text.index('{"step": 300,')
        with open(p, "r+b") as f:
            f.truncate(cut)
        with open(p, "a") as f:
            f.write(_lines(1000, 1400))
    elif change == "rewrite":  # one digit in the middle, same length, same inode
        mid = text.index('"train/loss": 3.0', len(text) // 2)
        with open(p, "r+b") as f:
            f.seek(mid + len('"train/loss": 3.0'))
            f.write(b"9")
    elif change == "rotate":  # a new file (new inode) with the same first line
        os.replace(p, tmp_path / "old.jsonl")
        p.write_text(_lines(1, 2) + _lines(3, 700))
    else:  # the same inode, another first line
        with open(p, "r+b") as f:
            f.write(b'{"step": 5')
    hits = _replays(monkeypatch)
    got, _ = _polls(p)
    _same(got, _polls(p, cache=False)[0])
    n_entries = len(got) - 1  # of the old file, the new one having as many polls or more
    if change in ("rotate", "head"):
        assert not any(hits)
    else:  # the polls before the change replay, the ones after it are parsed
        assert 0 < sum(hits) < n_entries
    again, _ = _polls(p)  # and the rebuilt cache replays
    _same(again, got)


def test_an_unwritable_or_damaged_cache_is_not_an_error(tmp_path, monkeypatch):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(1, 300))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    parsed, _ = _polls(p, cache=False)
    _same(_polls(p, cache_dir=blocker / "cache")[0], parsed)  # cannot be created: no cache
    d = tmp_path / "cache"
    _polls(p, cache_dir=d)
    entries = sorted(d.glob("metrics.jsonl-*/*/e*.npy"))
    assert len(entries) >= 3
    entries[0].write_bytes(b"not an npy")
    entries[1].write_bytes(entries[1].read_bytes()[:-100])  # torn
    _same(_polls(p, cache_dir=d)[0], parsed)
    for idx in d.glob("metrics.jsonl-*/*/index.json"):
        idx.write_text("{")
    _same(_polls(p, cache_dir=d)[0], parsed)


def test_another_key_filter_has_its_own_cache(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(1, 300))
    _polls(p)
    s = _source(p)
    keep, keys = watched_keys("eval_dropless/loss")
    b = s.poll_batch(keys, keep, parallel=False).batch
    assert "eval/loss" in b.cols and "eval_dropless/loss" in keys
    assert len(list((tmp_path / ".metrics.jsonl.watch-cache").iterdir())) == 2


def test_a_stateless_watch_from_the_cache_gives_the_same_verdict(tmp_path, monkeypatch):
    """Judged twice without a state file (the second time from the cache) and once without a
    cache: the same alerts, in order, and the same rule state."""
    rs = sy.make_run(TRUTH, TARGET, noise=NOISE, fault=sy.Fault("shift", 0.4, 0.03), seed=3,
                     offset=0.0).rows
    rs[len(rs) * 6 // 10]["train/loss"] = "NaN"
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rs))
    prereg = pr.write_once(tmp_path / "prereg.json",
                           make_prereg(sy.TruthLaw(TRUTH, run_sigma=0.005), TARGET,
                                       eval_noise=0.003))

    def watch(cache):
        w = Watcher(prereg, _source(p, cache=cache), [], None, clock=lambda: 1.7e9)
        w.poll()
        return [a.to_dict() for a in w.all_alerts], w.state, w.exit_code

    ref = watch(False)
    assert ref[2] != 0 and len(ref[0]) > 2
    hits = _replays(monkeypatch)
    assert watch(True) == ref
    assert watch(True) == ref and sum(hits) > 5


def test_a_restart_at_a_saved_position_replays_from_there(tmp_path, monkeypatch):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(1, 600))
    whole, _ = _polls(p)  # builds the cache
    s = _source(p)
    for _ in range(3):
        s.poll_batch(KEYS, KEEP, parallel=False)
    pos = json.loads(json.dumps(s.position()))  # as the state file keeps it
    hits = _replays(monkeypatch)
    r = _source(p)
    r.restore(pos)
    rest = []
    while True:
        q = r.poll_batch(KEYS, KEEP, parallel=False)
        rest.append((q, (q.notes, q.more, r.offset, r.line_no, r.max_step)))
        if not q.more:
            break
    _same(rest, whole[3:])
    assert sum(hits) == len(rest) - 1


def test_a_new_version_of_the_readers_replaces_the_old_cache(tmp_path, monkeypatch):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(1, 300))
    _polls(p)
    base = tmp_path / ".metrics.jsonl.watch-cache"
    old = list(base.iterdir())
    monkeypatch.setattr(column_cache, "_code_digest", lambda: "another version")
    _polls(p)
    new = list(base.iterdir())
    assert len(old) == len(new) == 1 and old != new


def test_the_last_poll_is_kept_while_the_file_does_not_grow(tmp_path, monkeypatch):
    """A tail entry (the poll that ended at the file's end, a torn last line included) replays
    only on a file of the same length; a follow's later polls add none; grown, it is parsed."""
    monkeypatch.setattr(column_cache, "TAIL_MIN_ROWS", 1)
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(1, 500) + '{"step": 500, "train/lo')
    parsed, _ = _polls(p, cache=False)
    _, follower = _polls(p)  # builds the cache, the tail entry too
    hits = _replays(monkeypatch)
    again, _ = _polls(p)
    _same(again, parsed)
    assert sum(hits) == len(parsed)  # the last poll too
    index = next((tmp_path / ".metrics.jsonl.watch-cache").glob("*/index.json"))
    before = json.loads(index.read_text())["entries"]
    with open(p, "a") as f:
        f.write('ss": 3.0}\n' + _lines(501, 504))
    assert len(follower.poll_batch(KEYS, KEEP, parallel=False).batch) == 4  # a follow's poll
    assert json.loads(index.read_text())["entries"] == before
    hits.clear()
    grown, _ = _polls(p)
    _same(grown, _polls(p, cache=False)[0])
    assert sum(hits) == len(grown) - 1  # the tail entry no longer holds: that poll is parsed
    hits.clear()
    _same(_polls(p)[0], grown)
    assert sum(hits) == len(grown)


def test_ladder_watch_twice_gives_the_same_output(tmp_path, capsys, monkeypatch):
    """`ladder watch` without a state file, twice: the second from the cache beside the file
    (the whole run as one tail entry), the same alert lines and exit status; and again with the
    cache removed."""
    import shutil

    from ladder.cli import main
    rs = sy.make_run(TRUTH, TARGET, noise=NOISE, fault=sy.Fault("shift", 0.4, 0.03), seed=5,
                     offset=0.0).rows
    assert len(rs) >= column_cache.TAIL_MIN_ROWS
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rs))
    prereg = pr.write_once(tmp_path / "prereg.json",
                           make_prereg(sy.TruthLaw(TRUTH, run_sigma=0.005), TARGET,
                                       eval_noise=0.003))

    def watch(extra=()):
        rc = main(["watch", str(prereg), "--source", str(p), "--json", *extra])
        doc = json.loads(capsys.readouterr().out)
        for a in doc.get("alerts", []):
            a.pop("time", None)
        return rc, doc

    first = watch()
    sidecar = tmp_path / ".metrics.jsonl.watch-cache"
    assert sidecar.is_dir()
    entries = [e for idx in sidecar.glob("*/index.json")
               for e in json.loads(idx.read_text())["entries"]]
    assert len(entries) == 1 and entries[0]["tail"]
    assert first[0] != 0 and first[1]["alerts"]
    assert watch() == first
    shutil.rmtree(sidecar)
    assert watch() == first

    # --column-cache DIR keeps it there (one folder a file), 'off' keeps none
    shutil.rmtree(sidecar)
    there = tmp_path / "caches"
    assert watch(["--column-cache", str(there)]) == first
    assert not sidecar.exists() and len(list(there.glob("metrics.jsonl-*/*/index.json"))) == 1
    hits = _replays(monkeypatch)
    assert watch(["--column-cache", str(there)]) == first
    assert hits and all(hits)
    assert watch(["--column-cache", "off"]) == first
    assert not sidecar.exists()


def test_a_last_poll_stopped_by_max_rows_at_the_end_is_a_tail_entry(tmp_path, monkeypatch):
    """The file ends inside the chunk in which the poll reached max_rows: the poll (more rows
    might follow) is kept as a tail entry, replayed with its `more` flag while the file stays."""
    monkeypatch.setattr(column_cache, "TAIL_MIN_ROWS", 1)
    p = tmp_path / "metrics.jsonl"
    for n in range(40, 120):  # the length at which the first poll reads the whole file
        p.write_text(_lines(1, n))
        s = _source(p, cache=False)
        if s.poll_batch(KEYS, KEEP, parallel=False).more and s.offset == p.stat().st_size:
            break
    else:
        pytest.fail("no such length")
    parsed, _ = _polls(p, cache=False)
    _polls(p)
    hits = _replays(monkeypatch)
    again, _ = _polls(p)
    _same(again, parsed)
    assert hits == [True] and again[0][1][1] is True  # replayed, with more=True
