"""The watcher's columnar JSONL reader against the full parser (``json.loads`` on every line and
``Batch.from_rows``) on generated adversarial files: the same rows, values (to the bit), masks of
written non-finite values, configurations, notes and bad-line counts."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from predict.jsonl_columns import read_columns
from predict import sources
from predict.sources import JsonlSource
from predict.watch import Batch, watched_keys

KEEP, KEYS = watched_keys("eval/loss")
FIXED = frozenset(KEYS)


def want(k):
    return k in FIXED or KEEP(k)


NUMBERS = ["0", "-0", "1", "-1", "7", "0.0", "-0.0", "1.5", "2.24228", "0.000100335", "9.96898e-05",
           "6.1e+18", "1E5", "1e-320", "5e-324", "1e999", "-1e999", "123456789012345678901234",
           "9007199254740993", "0.30000000000000004", "1443685.0474052331", "NaN", "Infinity",
           "-Infinity", "null"]
# tokens json.loads refuses, or values the columns do not take as numbers
ODD = ["01", ".5", "1.", "+1", "-", "1e", "1e+", "--1", "1.2.3", "0x10", "inf", "nan", "true",
       "false", '"1.5"', '"NaN"', '"x"', "[1, 2]", "{}", '{"a": 1}', "1 2", "", "1,", "NaN1",
       "\u00e9", "1_0", "Infinity1", "nul", "1e5.5", "00", "-01"]
KEYPOOL = ["step", "tokens", "progress", "train/loss", "loss", "eval/loss", "grad/norm",
           "params/norm/embed", "params/norm/router_bias", "params/norm/layer_1", "moe/drop_frac",
           "moe/router_entropy", "moe/load_max_over_mean", "moe/layer_0/load_max_over_mean",
           "flops", "time", "e", "1"]


def _num(rng):
    if rng.random() < 0.6:
        return repr(round(rng.gauss(0, 10) * 10 ** rng.randint(-8, 8), rng.randint(0, 9)))
    return rng.choice(NUMBERS)


def _line(rng, keys, sep=(": ", ", "), step=None):
    vals = []
    for k in keys:
        v = str(step) if k == "step" and step is not None else _num(rng)
        vals.append(f'"{k}"{sep[0]}{v}')
    return "{" + sep[1].join(vals) + "}"


def _mutate(rng, line):
    """One adversarial edit of a template line."""
    r = rng.random()
    if r < 0.35:  # a token replaced by an odd one
        spans = [m.span(1) for m in re.finditer(r":\s*([^,}\s]+)", line)]
        a, b = rng.choice(spans)
        return line[:a] + rng.choice(ODD) + line[b:]
    if r < 0.45:  # a key changed by one character (same length)
        i = line.index('"', 1) - 1
        return line[:i] + ("x" if line[i] != "x" else "y") + line[i + 1:]
    if r < 0.5:  # an escape that decodes to the same key
        return line.replace("train/loss", "train\\/loss", 1)
    if r < 0.55:  # a key inside a string value
        return line[:-1] + ', "note": "\\"train/loss\\": 5"}'
    if r < 0.6:  # nested object
        return line[:-1] + ', "config": {"seq_len": 128}}'
    if r < 0.65:  # whitespace
        return line.replace(": ", ":", 1).replace(", ", " , ", 1)
    if r < 0.7:  # a duplicate key (json keeps the last)
        return line[:-1] + ', "train/loss": 99.5}'
    if r < 0.75:
        return line + "\r"
    if r < 0.8:
        return rng.choice(["", "   ", "not json", "[1, 2]", '"x"', "{", line[: len(line) // 2],
                           "{}", "null", "\xff\xfe"])
    if r < 0.85:  # the step as a string, NaN or missing
        return line.replace('"step": ', '"step": "1', 1).replace(', "tokens"', '", "tokens"', 1)
    if r < 0.9:
        return line.replace(': ', ': -', 1)
    return line.replace("}", "  }")


def _file(seed: int) -> bytes:
    rng = random.Random(seed)
    shapes = []
    for _ in range(rng.randint(1, 3)):
        keys = rng.sample(KEYPOOL, rng.randint(2, len(KEYPOOL)))
        if "step" not in keys and rng.random() < 0.9:
            keys.insert(rng.randrange(len(keys) + 1), "step")
        shapes.append((keys, rng.choice([(": ", ", "), (":", ","), (" : ", " ,  ")])))
    lines = []
    n = rng.randint(20, 400)
    p_mut = rng.choice([0.0, 0.02, 0.2, 0.6])
    for i in range(n):
        keys, sep = shapes[0] if rng.random() < 0.8 else rng.choice(shapes)
        line = _line(rng, keys, sep, step=i + 1 if rng.random() < 0.97 else None)
        if rng.random() < p_mut:
            line = _mutate(rng, line)
        lines.append(line)
    return "\n".join(lines).encode("utf-8", "surrogateescape")


def _reference(block: bytes, line_no: int = 0):
    rows, bad, first = [], 0, None
    for k, raw in enumerate(block.split(b"\n")):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
            first = first or line_no + k + 1
    return rows, bad, first


def _same_batch(a: Batch, b: Batch):
    assert np.array_equal(a.step, b.step)
    assert set(a.cols) == set(b.cols)
    for k in a.cols:  # to the bit (NaN aside): -0.0 is not 0.0
        x, y = a.cols[k], b.cols[k]
        assert np.array_equal(np.isnan(x), np.isnan(y)), k
        ok = ~np.isnan(x)
        assert np.array_equal(x[ok].view(np.uint64), y[ok].view(np.uint64)), k
    assert set(a.nonfinite) == set(b.nonfinite)
    for k in a.nonfinite:
        assert np.array_equal(a.nonfinite[k], b.nonfinite[k]), k
    assert a.configs == b.configs
    assert sorted(a.notes) == sorted(b.notes)


@pytest.mark.parametrize("seed", range(60))
def test_columns_equal_the_full_parser(seed):
    block = _file(seed)
    rows, bad, first = _reference(block, 10)
    for keys, keep, w in ((KEYS, KEEP, want), (None, None, None)):
        c = read_columns(block, 10, w)
        assert (c.n, c.bad, c.first_bad) == (len(rows), bad, first)
        _same_batch(Batch.from_columns(c, keys=keys, keep=keep),
                    Batch.from_rows(rows, keys=keys, keep=keep))


def test_clean_lines_take_the_template_path():
    """A trainer's lines (one key set, another on eval rows) are read by templates, not one by
    one; the few that differ (a corrupt line, a nested config) by json.loads."""
    rng = random.Random(1)
    keys = ["step", "tokens", "train/loss", "grad/norm", "params/norm/embed", "flops"]
    lines = [_line(rng, keys + (["eval/loss"] if i % 50 == 0 else []), step=i + 1)
             for i in range(1000)]
    lines[500] = lines[500][:-3]
    lines[700] = lines[700][:-1] + ', "config": {"seq_len": 128}}'
    block = "\n".join(lines).encode()
    c = read_columns(block, 0, want)
    assert c.templated >= 970 and c.bad == 1 and c.first_bad == 501
    rows, _, _ = _reference(block)
    _same_batch(Batch.from_columns(c, keys=KEYS, keep=KEEP),
                Batch.from_rows(rows, keys=KEYS, keep=KEEP))


def test_source_reads_columns_as_rows(tmp_path, monkeypatch):
    """JsonlSource.poll_batch (columns) against poll() (rows, json.loads only): the same batch,
    bad-line note (naming the file and the line) and read position; a torn last line waits."""
    monkeypatch.setattr(sources, "_fast_loads", lambda: None)  # the stdlib parser decides
    block = _file(7)
    p = tmp_path / "metrics.jsonl"
    p.write_bytes(block + b'\n{"step": 9999, "train/lo')
    a, b = JsonlSource(p, max_rows=97), JsonlSource(p, max_rows=97)
    a.chunk_bytes = b.chunk_bytes = 4096
    while True:
        pa = a.poll_batch(KEYS, KEEP, parallel=False)
        pb = b.poll()
        _same_batch(pa.batch, Batch.from_rows(pb.rows, keys=KEYS, keep=KEEP))
        assert pa.notes == pb.notes and pa.more == pb.more
        assert (a.offset, a.line_no, a.max_step) == (b.offset, b.line_no, b.max_step)
        if not pa.more:
            break
    assert a.offset == len(block) + 1


def test_generated_files_exercise_templates():
    """The generated files are not all decided line by line (else the test above would only
    check json against itself): most have lines read by a template."""
    used = [read_columns(_file(seed), 0, want).templated > 0 for seed in range(60)]
    assert sum(used) >= 45


def test_columns_after_a_rotation_skip_steps_judged(tmp_path):
    """poll_batch (columns) on a replaced file: read again from its start, the steps already
    judged skipped (the row path's bookkeeping), then columns again."""
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "train/loss": 2.0}) + "\n" for s in range(1, 6)))
    src = JsonlSource(p)
    assert list(src.poll_batch(KEYS, KEEP, parallel=False).batch.step) == [1, 2, 3, 4, 5]
    p.unlink()
    p.write_text("".join(json.dumps({"step": s, "train/loss": 2.0}) + "\n" for s in range(3, 9)))
    got = src.poll_batch(KEYS, KEEP, parallel=False)
    assert list(got.batch.step) == [6, 7, 8] and any("replaced" in n for n in got.notes)
    with open(p, "a") as f:
        f.write(json.dumps({"step": 9, "train/loss": 2.0}) + "\n")
    assert list(src.poll_batch(KEYS, KEEP, parallel=False).batch.step) == [9]


@pytest.mark.parametrize("lines_per_piece", [1, 2, 3, 7])
def test_process_split_at_every_line_equals_one_process(tmp_path, lines_per_piece):
    """The backlog split at newlines over worker processes (JsonlSource.poll_batch's pool): with
    a piece of one line every line starts a piece; the same batch, offsets and line count as one
    process, a torn last line left for the next poll in both."""
    block = _file(11)
    p = tmp_path / "metrics.jsonl"
    lens = [len(x) + 1 for x in block.split(b"\n")]
    results = []
    for par in (False, True):
        p.write_bytes(block + b'\n{"step": 9999, "train/lo')
        src = JsonlSource(p)
        src.cache = False
        if par:  # the pool on any machine, in pieces of ~lines_per_piece lines
            src.parallel_min_workers, src.parallel_min_bytes = 1, 1
            src.piece_bytes = max(1, min(lens) * lines_per_piece - 1)
        else:
            src.parallel_min_bytes = 1 << 62
        got = []
        for tail in (b"", b'ss": 1.5}\n'):
            with open(p, "ab") as f:
                f.write(tail)
            while True:
                q = src.poll_batch(KEYS, KEEP)
                got.append((q.batch, src.offset, src.line_no, src.max_step))
                if not q.more:
                    break
        results.append(got)
    ref, par = results
    assert [g[1:] for g in ref][-1] == [g[1:] for g in par][-1]
    assert ref[-1][1] == p.stat().st_size
    from predict.watch import concat_batches
    _same_batch(concat_batches([g[0] for g in par]), concat_batches([g[0] for g in ref]))
