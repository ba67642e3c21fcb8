"""ladder.io without orjson (issue 37 item 5): the standard-library reader gives every JSON line
the value orjson gives it, and the lines orjson refuses go where they always went."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import same

from ladder import io


def both(raw: bytes):
    """(value, by_stdlib) with orjson, and without it."""
    with_orjson = io.json_line(raw)
    saved = io.orjson
    io.orjson = None
    try:
        without = io.json_line(raw)
    finally:
        io.orjson = saved
    return with_orjson, without


scalars = (st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
           | st.integers(min_value=-2 ** 70, max_value=2 ** 70) | st.text())
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4)
                      | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(values)
def test_any_json_value_reads_the_same(value):
    raw = json.dumps(value).encode()
    (a, _), (b, by_stdlib) = both(raw)
    assert same(a, b), (raw, a, b)
    assert by_stdlib


@pytest.mark.parametrize("line", [
    b'{"step": 3, "loss": NaN, "x": Infinity}',      # orjson refuses: the stdlib reads
    b'{"big": 1e999}',                                # beyond float range
    b'{"s": "\\ud800"}',                              # a lone surrogate
    b'{"i": 18446744073709551616}',                   # 2**64: orjson reads a float
    b'{"i": -9223372036854775809}',                   # below -2**63
    b'{"i": 18446744073709551615, "j": -9223372036854775808}',   # the ends of the range
    b'{"a": [1, 2.5e-320, "x\\u00e9", {"b": null}]}',
    b'{"step": 3, "loss"',                            # a partial line
    b'[' * 2000 + b']' * 2000,                        # too deep
    b'\xff\xfe{}',                                    # not UTF-8
    b'1' * 5000,                                      # an integer too long to convert
])
def test_edge_lines_read_the_same(line):
    (a, _), (b, _) = both(line)
    assert same(a, b), (line[:60], a, b)
