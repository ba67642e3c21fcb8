"""`ladder tokenize` streams: JSONL and Parquet records are documents (--text-key), text files
stay one document each; shards are written as it goes (memory bounded by the chunk, not the
corpus), record documents/tokens/sha256 each; a run killed mid-way and run again writes the
same shards bitwise as an uninterrupted one; worker processes change nothing; manifests name
only files inside their folder; version-1 manifests still load."""

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ladder.cli.main import main
from ladder.io import InputError, atomic_write_json, read_json
from ladder.trainer import tokens as T
from ladder.trainer.corpus_files import is_held_out
from ladder.trainer.data import load_corpus

ROOT = Path(__file__).resolve().parent.parent
EOS = "<|endoftext|>"
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega scaling ladder expert router token").split()


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokenizer")
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=50)) for _ in range(50)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(root / "tokenizer.json"))
    return root / "tokenizer.json"


def _records(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 60)))) + f" #{i}"
            for i in range(n)]


def _write_jsonl(path: Path, texts: list[str], key: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, key: t}) + "\n")
            if i % 7 == 3:
                f.write("\n")                     # blank lines are skipped
    return path


def _stream(out: Path, m: dict, split: str) -> np.ndarray:
    parts = [np.fromfile(out / s["file"], np.dtype(m["dtype"]))
             for s in m["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def _files(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def _manifest_without_time(out: Path) -> dict:
    m = read_json(out / "manifest.json", schema="token-shards")
    m.pop("created")
    return m


def test_jsonl_records_are_documents_split_by_their_text_and_shards_record_counts(tmp_path,
                                                                                 tok_path):
    texts = _records(120)
    src = _write_jsonl(tmp_path / "a.jsonl", texts[:70])
    _write_jsonl(tmp_path / "b.jsonl", texts[70:])
    out = tmp_path / "out"
    assert main(["tokenize", str(tmp_path / "*.jsonl"), "--tokenizer", str(tok_path), "--out",
                 str(out), "--shard-tokens", "500", "--processes", "0"]) == 0
    m = read_json(out / "manifest.json", schema="token-shards")
    assert m["schema"] == "token-shards/2" and m["sources"]["kinds"] == {"jsonl": 2}
    tok = Tokenizer.from_file(str(tok_path))
    for split in ("train", "val"):
        docs = [t for t in texts if is_held_out(t) == (split == "val")]
        sp = m["splits"][split]
        assert sp["documents"] == len(docs) and sp["text_bytes"] == sum(len(t.encode())
                                                                       for t in docs)
        stream = _stream(out, m, split)
        assert sp["tokens"] == len(stream)
        # in order, each document's ids then EOS (the words never contain the EOS string)
        assert tok.decode(stream.tolist(), skip_special_tokens=False) == "".join(
            t + EOS for t in docs)
        for sh in sp["shards"]:
            data = (out / sh["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == sh["sha256"]
            assert sh["tokens"] == len(data) // 2
            assert sh["documents"] == int((np.frombuffer(data, np.uint16) == m["eos_id"]).sum())
        assert all(s["tokens"] == 500 for s in sp["shards"][:-1])
    assert m["splits"]["val"]["documents"] > 0
    assert not (out / T.PROGRESS).exists() and not list(out.glob("*.partial"))
    # what it writes, `ladder run --data` reads
    corpus = load_corpus((str(out),))
    assert len(corpus.val) == m["splits"]["val"]["tokens"] and corpus.vocab_size == 300
    assert src.exists()


def test_parquet_and_text_files_and_the_text_key(tmp_path, tok_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = _records(60, seed=1)
    pq.write_table(pa.table({"body": texts[:40], "n": list(range(40))}), tmp_path / "a.parquet",
                   row_group_size=7)
    _write_jsonl(tmp_path / "b.jsonl", texts[40:], key="body")
    (tmp_path / "c.txt").write_text("one plain text file\nis one document\n")
    out = tmp_path / "out"
    m = T.tokenize_files([str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl"),
                          str(tmp_path / "c.txt")], tok_path, out, text_key="body",
                         shard_tokens=300)
    assert m["sources"]["kinds"] == {"jsonl": 1, "parquet": 1, "text": 1}
    assert sum(m["splits"][s]["documents"] for s in ("train", "val")) == 61
    # a missing key or column is one line naming the file and --text-key
    for f in ("a.parquet", "b.jsonl"):
        with pytest.raises(InputError, match=f"{f}.*--text-key"):
            T.tokenize_files([str(tmp_path / f)], tok_path, tmp_path / f"x-{f}")


def test_processes_do_not_change_the_shards(tmp_path, tok_path):
    _write_jsonl(tmp_path / "a.jsonl", _records(200, seed=2))
    outs = []
    for n in (0, 2):
        out = tmp_path / f"p{n}"
        T.tokenize_files([str(tmp_path / "a.jsonl")], tok_path, out, shard_tokens=700,
                         processes=n, chunk_chars=2000)
        outs.append(out)
    assert _files(outs[0]) == _files(outs[1])
    assert _manifest_without_time(outs[0]) == _manifest_without_time(outs[1])


class _Crash(Exception):
    pass


def _crash_after(monkeypatch, calls: int) -> None:
    """The writer dies at its ``calls``-th append (a crash mid-run: open files are closed by the
    exception, so more is on disk than the progress file records)."""
    real = T._SplitWriter.append
    count = {"n": 0}

    def append(self, *a):
        count["n"] += 1
        if count["n"] == calls:
            real(self, *a)           # part of the chunk is written, then the crash
            raise _Crash
        return real(self, *a)
    monkeypatch.setattr(T._SplitWriter, "append", append)


@pytest.fixture(scope="module")
def resume_corpus(tmp_path_factory, tok_path):
    root = tmp_path_factory.mktemp("resume")
    _write_jsonl(root / "a.jsonl", _records(100, seed=3))
    _write_jsonl(root / "b.jsonl", _records(30, seed=4))
    ref = root / "ref"
    T.tokenize_files([str(root / "*.jsonl")], tok_path, ref, shard_tokens=400, chunk_chars=900)
    return root, ref


@pytest.mark.heavy  # 4 s on 2 busy cores
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.integers(1, 30), twice=st.booleans())
def test_a_crash_anywhere_then_a_rerun_writes_the_uninterrupted_shards(
        resume_corpus, tok_path, tmp_path_factory, monkeypatch, calls, twice):
    root, ref = resume_corpus
    out = tmp_path_factory.mktemp("crash") / "out"
    args = ([str(root / "*.jsonl")], tok_path, out)
    kw = {"shard_tokens": 400, "chunk_chars": 900}
    with monkeypatch.context() as mp:
        _crash_after(mp, calls)
        with pytest.raises(_Crash):
            T.tokenize_files(*args, **kw)
    if twice:   # crash again, later, while resuming
        with monkeypatch.context() as mp:
            _crash_after(mp, 3)
            try:
                T.tokenize_files(*args, **kw)
            except _Crash:
                pass
    T.tokenize_files(*args, **kw)
    assert _files(out) == _files(ref)
    assert _manifest_without_time(out) == _manifest_without_time(ref)


@pytest.mark.slow
def test_killed_with_sigkill_and_run_again_equals_the_uninterrupted_run(tmp_path, tok_path):
    """A real kill (no exception handlers run): the child is SIGKILLed once its progress file
    lists a closed shard; the same command, run again, finishes with the same files."""
    _write_jsonl(tmp_path / "a.jsonl", _records(3000, seed=5))
    cmd = [sys.executable, "-m", "ladder", "-q", "tokenize", str(tmp_path / "a.jsonl"),
           "--tokenizer", str(tok_path), "--shard-tokens", "200", "--processes", "0"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    subprocess.run([*cmd, "--out", str(ref)], check=True, cwd=ROOT, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([*cmd, "--out", str(out)], cwd=ROOT, env=env)
    deadline = time.monotonic() + 300
    killed_mid_way = False
    while p.poll() is None and time.monotonic() < deadline:
        try:
            prog = json.loads((out / T.PROGRESS).read_text())
            if prog["splits"]["train"]["shards"]:
                p.send_signal(signal.SIGKILL)
                killed_mid_way = True
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)
    p.wait(timeout=60)
    assert killed_mid_way, "the run ended before it could be killed"
    assert not (out / "manifest.json").exists()
    subprocess.run([*cmd, "--out", str(out)], check=True, cwd=ROOT, timeout=300)
    assert _files(out) == _files(ref)
    assert _manifest_without_time(out) == _manifest_without_time(ref)


def test_a_rerun_with_other_options_or_inputs_is_refused(tmp_path, tok_path, monkeypatch):
    _write_jsonl(tmp_path / "a.jsonl", _records(80, seed=6))
    out = tmp_path / "out"
    with monkeypatch.context() as mp:
        _crash_after(mp, 4)
        with pytest.raises(_Crash):
            T.tokenize_files([str(tmp_path / "a.jsonl")], tok_path, out, shard_tokens=300,
                             chunk_chars=500)
    with pytest.raises(InputError, match="progress.json: field 'settings.shard_tokens'"):
        T.tokenize_files([str(tmp_path / "a.jsonl")], tok_path, out, shard_tokens=301)
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    with pytest.raises(InputError, match="field 'inputs'"):
        T.tokenize_files([str(tmp_path / "a.jsonl")], tok_path, out, shard_tokens=300)


def test_one_text_file_holds_out_the_last_5_percent_and_resumes_through_the_recut(
        tmp_path, tok_path, monkeypatch):
    """Too few documents for the hash to fill both splits: the stream's tail is held out (as
    before), also when the run crashes while cutting it."""
    text = " ".join(_records(200, seed=7))
    (tmp_path / "book.txt").write_text(text)
    tok = Tokenizer.from_file(str(tok_path))
    ids = tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id(EOS)]
    cut = int(len(ids) * 0.95)
    ref = T.tokenize_files([str(tmp_path / "book.txt")], tok_path, tmp_path / "ref",
                           shard_tokens=500)
    assert ref["split_rule"].startswith("last 5%")
    assert _stream(tmp_path / "ref", ref, "train").tolist() == ids[:cut]
    assert _stream(tmp_path / "ref", ref, "val").tolist() == ids[cut:]
    out = tmp_path / "out"
    with monkeypatch.context() as mp:
        _crash_after(mp, 6)     # 1 append of the reading phase, then the recut's
        with pytest.raises(_Crash):
            T.tokenize_files([str(tmp_path / "book.txt")], tok_path, out, shard_tokens=500)
    assert read_json(out / T.PROGRESS)["phase"] == "recut"
    T.tokenize_files([str(tmp_path / "book.txt")], tok_path, out, shard_tokens=500)
    assert _files(out) == _files(tmp_path / "ref")


@pytest.mark.heavy  # 5 s on 2 busy cores
def test_memory_is_bounded_by_the_chunk_not_the_corpus(tmp_path, tok_path):
    """Python-side peak while tokenizing 0.5 MB and 2 MB of JSONL in 16K-character chunks: the
    same (the old writer held every token of the corpus: its peak grew 4x)."""
    peaks = []
    for n in (1, 4):
        src = tmp_path / f"c{n}.jsonl"
        _write_jsonl(src, _records(2500 * n, seed=8))
        assert src.stat().st_size > n * 500_000
        tracemalloc.start()
        T.tokenize_files([str(src)], tok_path, tmp_path / f"o{n}", shard_tokens=1 << 15,
                         chunk_chars=1 << 14)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.5 * peaks[0], peaks
    assert peaks[1] < 3_000_000, peaks


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(max_size=40), min_size=1, max_size=30))
def test_any_records_come_back_in_order_with_one_eos_each(tmp_path_factory, tok_path, texts):
    """Arbitrary text (empty, newlines, the EOS string itself, lone surrogates JSON can escape):
    every record is one document, decoded back in order, followed by one EOS."""
    root = tmp_path_factory.mktemp("any")
    with open(root / "r.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    try:
        m = T.tokenize_files([str(root / "r.jsonl")], tok_path, root / "out", shard_tokens=7)
    except InputError as e:
        assert "too little text" in str(e)
        return
    tok = Tokenizer.from_file(str(tok_path))
    clean = [T._SURROGATE.sub("\ufffd", t) for t in texts]
    ids = {s: _stream(root / "out", m, s).tolist() for s in ("train", "val")}
    if m["split_rule"].startswith("last"):   # the cut may fall inside a character's bytes
        assert tok.decode(ids["train"] + ids["val"], skip_special_tokens=False) == "".join(
            t + EOS for t in clean)
    else:
        for s in ("train", "val"):
            assert tok.decode(ids[s], skip_special_tokens=False) == "".join(
                t + EOS for t in clean if is_held_out(t) == (s == "val"))
        assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == len(texts)


def test_bad_jsonl_lines_name_the_file_and_the_line(tmp_path, tok_path):
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "fine"}\n\n["text"]\n')
    for f, what in (("a.jsonl", "line 2: not valid JSON"), ("b.jsonl", "line 3: expected")):
        with pytest.raises(InputError, match=f"{f}.*{what}") as e:
            T.tokenize_files([str(tmp_path / f)], tok_path, tmp_path / f"o-{f}")
        assert "\n" not in str(e.value) and e.value.exit_code >= 64


def _shard_dir(tmp_path, tok_path) -> Path:
    _write_jsonl(tmp_path / "a.jsonl", _records(100, seed=9))
    T.tokenize_files([str(tmp_path / "a.jsonl")], tok_path, tmp_path / "s", shard_tokens=600)
    return tmp_path / "s"


@pytest.mark.parametrize("name", ["../x.bin", "/etc/passwd", "sub/train-00000.bin", "..", ""])
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(tmp_path, tok_path, name):
    out = _shard_dir(tmp_path, tok_path)
    m = read_json(out / "manifest.json")
    (tmp_path / "x.bin").write_bytes((out / m["splits"]["train"]["shards"][0]["file"])
                                     .read_bytes())
    m["splits"]["train"]["shards"][0]["file"] = name
    atomic_write_json(out / "manifest.json", m)
    with pytest.raises(InputError, match=r"manifest.json: field 'splits.train.shards\[0\].file'"
                       r": not a safe name") as e:
        load_corpus((str(out),))
    assert "\n" not in str(e.value)


def test_a_version_1_manifest_still_loads(tmp_path, tok_path):
    """What the earlier `ladder tokenize` wrote (token-shards/1: no document counts per shard,
    no inputs' kinds) is still read by `ladder run --data`."""
    out = _shard_dir(tmp_path, tok_path)
    m = read_json(out / "manifest.json")
    v1 = {"schema": "token-shards/1", "dtype": m["dtype"], "vocab_size": m["vocab_size"],
          "eos_id": m["eos_id"], "tokenizer": m["tokenizer"],
          "sources": {"files": 1, "sha256_files_and_contents": "0" * 64},
          "split_rule": "sha256(path relative to the files' common folder) mod 20 == 0",
          "splits": {s: {"documents": m["splits"][s]["documents"],
                         "text_bytes": m["splits"][s]["text_bytes"],
                         "tokens": m["splits"][s]["tokens"],
                         "shards": [{"file": sh["file"], "tokens": sh["tokens"],
                                     "sha256": sh["sha256"]} for sh in m["splits"][s]["shards"]]}
                     for s in ("train", "val")}, "created": 0.0}
    atomic_write_json(out / "manifest.json", v1)
    corpus = load_corpus((str(out),))
    assert corpus.fingerprint["kind"] == "token-shards"
    assert len(corpus.val) == m["splits"]["val"]["tokens"]
    assert corpus.bytes_per_token == pytest.approx(m["splits"]["val"]["text_bytes"]
                                                   / m["splits"]["val"]["tokens"])
    v1["schema"] = "token-shards/3"
    atomic_write_json(out / "manifest.json", v1)
    with pytest.raises(InputError, match="field 'schema'"):
        load_corpus((str(out),))


def test_the_held_out_stream_is_read_across_shards_without_joining_them(tmp_path, tok_path):
    out = _shard_dir(tmp_path, tok_path)
    m = read_json(out / "manifest.json")
    whole = _stream(out, m, "val")
    corpus = load_corpus((str(out),))
    assert len(m["splits"]["val"]["shards"]) >= 1
    parts = [whole[:5], whole[5:11], whole[11:]]
    s = T.Stream(parts)
    idx = np.array([[0, 4, 5, 6], [10, 11, len(whole) - 1, 3]])
    assert np.array_equal(s[idx], whole[idx]) and len(s) == len(whole)
    assert np.array_equal(corpus.eval_batches(1, 2, 8)[0]["tokens"],
                          T.TokenShards(out, (), whole, 300, m["eos_id"], {}, None)
                          .eval_batches(1, 2, 8)[0]["tokens"])


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_a_progress_bar_on_a_terminal_only(tmp_path, tok_path, monkeypatch, terminal):
    """Issue 38: `ladder tokenize` was silent for its whole run; on a terminal it draws a bar in
    input bytes that ends at the corpus's size, and in a log (not a terminal) nothing."""
    _write_jsonl(tmp_path / "a.jsonl", _records(60))
    _write_jsonl(tmp_path / "b.jsonl", _records(40, seed=1))
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    out = tmp_path / "out"
    assert main(["tokenize", str(tmp_path / "*.jsonl"), "--tokenizer", str(tok_path), "--out",
                 str(out), "--shard-tokens", "500", "--processes", "0"]) == 0
    text = err.getvalue()
    if not terminal:
        assert "tokenize ->" not in text
        return
    assert "tokenize -> out" in text
    last = text.replace("\r", "\n").strip().splitlines()[-1]
    assert "100%" in last, last  # every input byte counted
