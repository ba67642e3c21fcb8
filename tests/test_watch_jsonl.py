"""One JSON reader (issue 24 item 3): JSON lines are parsed by orjson, a C parser, and the lines
it refuses (NaN/Infinity tokens, integers beyond 64 bits) by the standard library, so that every
line reads as ``json.loads`` reads it. Checked against ``json.loads`` itself on generated lines,
and the metrics.jsonl contract of DESIGN.md (a partial last line waits, unknown keys pass,
repeated steps: the last wins, NaN/Infinity as strings or tokens are written non-finite)."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import same

from ladder.io import iter_jsonl, json_line, read_metrics
from ladder.sources import JsonlSource, parse_lines


def reference(raw: bytes):
    """What ``json.loads`` makes of one line: the dict, or None (not a JSON object); with the
    one documented difference of orjson (ladder.io.json_line): on a line orjson parses, an
    integer outside [-2**63, 2**64) reads as the nearest float. A line orjson refuses as a
    whole (a NaN token, a number beyond float range) is read by ``json.loads``, integers exact
    (hypothesis found ``{"step": 1e999, "step": -9223372036854775809}``)."""
    try:
        v = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(v, dict):
        return None
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return v
    return _wide_ints_as_floats(v)


def _wide_ints_as_floats(v):
    if isinstance(v, dict):
        return {k: _wide_ints_as_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_wide_ints_as_floats(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and not -2 ** 63 <= v < 2 ** 64:
        return float(v)  # within float range: orjson refuses a line with one beyond it
    return v


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),   # NaN, Infinity tokens
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(2 ** 70), 2 ** 70).map(str),                        # beyond 64 bits too
    st.sampled_from(["1e999", "-0.0", "5e-324", "1E5", "0.30000000000000004", "01", "1.",
                     ".5", "+1", "-", "NaN1", "nan", "inf", "1_0", "0x10", "9" * 5000]))
VALUES = st.one_of(NUMBERS, st.sampled_from(['"NaN"', '"Infinity"', '"x"', "null", "true",
                                             '"\\ud800"', '"\\u00e9"', "[1, 2]", "{}"]))
KEYS = st.sampled_from(["step", "tokens", "eval/loss", "params/norm/x", "e", "é", 'a\\"b'])


@st.composite
def lines(draw):
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=40))
    if kind == 1:
        return draw(st.sampled_from([b"", b"  ", b"[1]", b"1", b"null", b'"x"', b"{", b"}",
                                     b"\xff\xfe{}", b"[" * 3000 + b"]" * 3000,
                                     b'{"a": ' + b"[" * 3000 + b"]" * 3000 + b"}"]))
    pairs = draw(st.lists(st.tuples(KEYS, VALUES), max_size=6))
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"
    if kind == 2 and text:  # torn or glued
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.sampled_from(["", "}", '{"b": 1}', ","]))
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(lines(), min_size=1, max_size=12))
def test_every_line_reads_as_json_loads_reads_it(raw_lines):
    raw_lines = [ln.replace(b"\n", b" ") for ln in raw_lines]
    block = b"\n".join(raw_lines)
    rows: list = []
    bad, first, n = parse_lines(block, 100, rows)
    want = [reference(ln) for ln in raw_lines]
    expected = [r for r in want if r is not None]
    blank = [not ln.strip() for ln in raw_lines]
    assert n == len(raw_lines)
    assert len(rows) == len(expected) and all(same(a, b) for a, b in zip(rows, expected))
    assert bad == sum(r is None and not b for r, b in zip(want, blank))
    firsts = [i + 101 for i, (r, b) in enumerate(zip(want, blank)) if r is None and not b]
    assert first == (firsts[0] if firsts else None)
    for ln, r in zip(raw_lines, want):  # the one-line reader of ladder.io too
        if ln.strip():
            got, _ = json_line(ln.strip())
            assert (got if isinstance(got, dict) else None) is None if r is None else \
                same(got, r)


def test_the_metrics_contract(tmp_path):
    """DESIGN.md: partial last line, unknown keys, repeated steps (last wins), NaN/Infinity."""
    p = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "train/loss": 3.0 - s / 100, "unknown/key": [s]} for s in range(1, 301)]
    rows[10]["train/loss"] = "NaN"          # as a string
    rows[20]["grad/norm"] = float("inf")    # as a token: Infinity
    rows.append({"step": 5, "train/loss": 9.0})  # the step again: this row wins
    p.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 301, "train/lo')
    src = JsonlSource(p)
    b = src.poll_batch(["train/loss", "grad/norm"], None).batch
    assert len(b) == 300 and b.step[-1] == 300          # the partial line waits
    assert b.cols["train/loss"][4] == 9.0               # last wins
    assert b.nonfinite["train/loss"][10] and math.isnan(b.cols["train/loss"][10])
    assert b.nonfinite["grad/norm"][20] and b.nonfinite["grad/norm"].sum() == 1
    with open(p, "a") as f:
        f.write('ss": 2.5}\n')
    b2 = src.poll_batch(["train/loss"], None).batch
    assert b2.step.tolist() == [301] and b2.cols["train/loss"].tolist() == [2.5]
    assert [r["step"] for r in read_metrics(p)] == list(range(1, 302))
    assert read_metrics(p)[4]["train/loss"] == 9.0
    assert sum(1 for _ in iter_jsonl(p)) == 302


def test_a_file_read_in_many_polls_equals_one_read(tmp_path):
    """Blocks, polls of max_rows and per-block columns give the batch of one pass."""
    from ladder.predict.watch import concat_batches
    p = tmp_path / "m.jsonl"
    rng = np.random.default_rng(0)
    with open(p, "w") as f:
        for s in range(1, 5001):
            r = {"step": s, "a": float(rng.normal())}
            if s % 97 == 0:
                r["b"] = "NaN"
            if s % 500 == 0:
                f.write("garbage\n")
            f.write(json.dumps(r) + "\n")
    one = JsonlSource(p).poll_batch(None, None)
    small = JsonlSource(p, chunk_bytes=3000, max_rows=700)
    parts = []
    while True:
        q = small.poll_batch(None, None)
        parts.append(q.batch)
        if not q.more:
            break
    many = concat_batches(parts)
    np.testing.assert_array_equal(one.batch.step, many.step)
    for k in one.batch.cols:
        np.testing.assert_array_equal(one.batch.cols[k], many.cols[k])
        np.testing.assert_array_equal(one.batch.nonfinite.get(k, np.zeros(0, bool)),
                                      many.nonfinite.get(k, np.zeros(0, bool)))
    assert small.line_no == one.batch.step.size + 10 == 5010
