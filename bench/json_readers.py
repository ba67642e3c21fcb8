"""The C JSON parsers a metrics.jsonl could be read with, side by side on one file (issue 24
item 3): a plain ``json.loads`` loop (the baseline the gate is stated against), ``orjson.loads``
per line (what ``ladder.io.json_line`` and the watcher use), and ``pyarrow.json.read_json`` with
an explicit schema (columns straight from C, no dict per line).

For each: wall and CPU seconds in this process, one after another, on a file already in the page
cache (read once first), and what it cannot read: orjson refuses NaN/Infinity tokens (the
watcher sends those lines to ``json.loads``); pyarrow refuses a whole block for one such line
and one line whose keys or types differ from the schema. With ``--check``, every value orjson
gives is compared with ``json.loads``'s (type, value, the sign of zeros) and pyarrow's columns
with ``json.loads``'s values.

    nice python bench/json_readers.py --lines 1000000 [--keep FILE] [--check]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def json_loop(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
            n += 1
    return n


def orjson_loop(path: Path) -> tuple[int, int]:
    import orjson
    n = fallback = 0
    with open(path, "rb") as f:
        for line in f:
            try:
                orjson.loads(line)
            except orjson.JSONDecodeError:
                json.loads(line)
                fallback += 1
            n += 1
    return n, fallback


def arrow_schema(path: Path):
    import pyarrow as pa
    with open(path, "rb") as f:
        first = json.loads(f.readline())
    return pa.schema([(k, pa.int64() if isinstance(v, int) else pa.float64())
                      for k, v in first.items()])


def arrow_read(path: Path, schema):
    import pyarrow.json as pj
    return pj.read_json(path, parse_options=pj.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="ignore"),
        read_options=pj.ReadOptions(block_size=16 << 20, use_threads=True))


def _same(a, b) -> bool:
    """Equal as json.loads gives them: types, values, and the sign of zeros."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return a == b


def check_orjson(path: Path) -> tuple[int, int]:
    import orjson
    values = differ = 0
    with open(path, "rb") as f:
        for line in f:
            ref = json.loads(line)
            try:
                got = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # the fallback is json.loads itself
            values += len(ref)
            if not _same(ref, got):
                differ += 1
    return values, differ


def check_arrow(path: Path, table) -> tuple[int, int]:
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    values = differ = 0
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            ref = json.loads(line)
            for k, col in cols.items():
                if k in ref:
                    values += 1
                    v = col[i]
                    r = ref[k]
                    if v is None or struct.pack("<d", float(v)) != struct.pack("<d", float(r)):
                        differ += 1
    return values, differ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--keep", default=None, help="write (or reuse) the metrics file here")
    ap.add_argument("--check", action="store_true", help="compare every value with json.loads")
    args = ap.parse_args(argv)
    from bench.watch_follow_speed import target_and_prereg, write_metrics
    tmp = None
    if args.keep:
        path = Path(args.keep)
    else:
        tmp = tempfile.mkdtemp()
        path = Path(tmp) / "metrics.jsonl"
    if not path.exists():
        truth, target, _ = target_and_prereg(args.lines)
        write_metrics(path, args.lines, truth, target)
    size = path.stat().st_size
    path.read_bytes()  # into the page cache: every reader below starts from memory
    print(f"{path}: {size / 1e6:.0f} MB; {os.cpu_count()} cores, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    dt, cpu, n = timed(lambda: json_loop(path))
    base = dt
    rows.append(("json.loads per line (baseline)", dt, cpu, f"{n:,} lines"))
    dt, cpu, (n, fb) = timed(lambda: orjson_loop(path))
    rows.append(("orjson.loads per line", dt, cpu, f"{fb} line(s) to json.loads"))
    try:
        schema = arrow_schema(path)
        dt, cpu, table = timed(lambda: arrow_read(path, schema))
        rows.append(("pyarrow.json.read_json (schema)", dt, cpu,
                     f"{table.num_rows:,} rows x {table.num_columns} columns; threads"))
    except ImportError:
        table = None
        rows.append(("pyarrow.json.read_json (schema)", math.nan, math.nan,
                     "pyarrow not installed (pip install 'ladder[parquet]')"))
    print("\n| reader | wall s | CPU s | / json.loads wall | notes |\n|---|---|---|---|---|")
    for name, dt, cpu, note in rows:
        print(f"| {name} | {dt:.2f} | {cpu:.2f} | {dt / base:.2f} | {note} |")
    # what each refuses: a line with a bare NaN token (the trainer writes "NaN" strings, other
    # tools write the token) and a line with a new key
    probe = path.with_name(path.name + ".probe")
    with open(path, "rb") as f:
        head = [next(f) for _ in range(1000)]
    nan_line = json.dumps({**json.loads(head[0]), "train/loss": float("nan")}).encode() + b"\n"
    probe.write_bytes(b"".join(head[:500]) + nan_line + b"".join(head[500:]))
    _, _, (_, fb) = timed(lambda: orjson_loop(probe))
    print(f"\na bare NaN token on one line of 1,001: orjson refuses {fb} line (sent to "
          f"json.loads)", end="")
    if table is not None:
        try:
            arrow_read(probe, schema)
            print("; pyarrow reads the block")
        except Exception as e:  # noqa: BLE001 - what it raises is the finding
            print(f"; pyarrow refuses the whole block ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:80]})")
    probe.unlink()
    if args.check:
        dt, _, (values, differ) = timed(lambda: check_orjson(path))
        print(f"orjson vs json.loads: {values:,} values compared, {differ} line(s) differ "
              f"({dt:.0f} s)")
        if table is not None:
            dt, _, (values, differ) = timed(lambda: check_arrow(path, table))
            print(f"pyarrow vs json.loads: {values:,} values compared, {differ} differ "
                  f"({dt:.0f} s)")
    if tmp:
        path.unlink()
        os.rmdir(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
