"""Live metric sources for the watcher. Each source's ``poll()`` returns a :class:`Poll` of the rows
that arrived since the last poll (dicts with ``step`` and metric keys), run configurations seen, and
notes about the input; ``position()``/``restore()`` give a JSON-serialisable read position so a
restarted watcher continues where it stopped (no row judged twice, none skipped).

- :class:`JsonlSource`: a metrics.jsonl, tailed by byte offset, each line parsed by orjson (the
  standard library for lines with NaN/Infinity tokens). A partial last line waits for its
  newline; a corrupt complete line is skipped with a note; a truncated or replaced (rotated) file is
  read again from its start, and the rows of steps already judged are skipped. A watcher started
  again with its ``--state`` continues at the saved byte offset.
- :class:`CsvSource`: a CSV, incl. W&B exports (``_step``/``Step`` columns, ``<run> - <key>``
  chart columns, ``__MIN``/``__MAX`` dropped).
- :class:`WandbOfflineSource`: a W&B offline run directory (or its ``.wandb`` file), read with
  ``wandb leet inspect --json`` (wandb >= 0.2x) or, when that is unavailable, by decoding the record
  log directly with wandb's protobuf classes.
- :class:`WandbApiSource`: ``wandb://ENTITY/PROJECT/ID[,ID...]`` through the public API; several
  ids form one lineage (a restarted run gets a new id) and later ids win for repeated steps.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ladder.io import EX_NOINPUT, InputError, as_float, json_line, open_input, read_json
from ladder.runs import ended_status


@dataclass
class Poll:
    rows: list[dict] = field(default_factory=list)
    configs: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    more: bool = False  # the source has more rows ready: poll again at once
    batch: Any = None   # rows already as columns (predict.watch.Batch), when the source made them


def open_source(src: str, *, follow: bool = False, **kw):
    """The source for a ``--source`` argument. With ``follow``, a path that does not exist yet
    is waited for (a watcher started before the run): its suffix says what it will be
    (``.csv``/``.tsv``, ``.wandb``, else a metrics JSONL; a name without suffix is a run
    directory, whose ``metrics.jsonl`` is awaited)."""
    if src.startswith("wandb://"):
        return WandbApiSource(src, **kw)
    p = Path(src)
    if not p.exists() and follow:
        suffix = p.suffix.lower()
        if suffix in (".csv", ".tsv"):
            return CsvSource(p)
        if suffix == ".wandb":
            return WandbOfflineSource(p)
        return JsonlSource(p if suffix else p / "metrics.jsonl")
    if not p.exists():
        raise InputError("no such file or directory", path=src, field="--source",
                         exit_code=EX_NOINPUT)
    if not p.is_dir():
        _regular(p)
    if p.is_dir():
        if (p / "metrics.jsonl").exists():
            return JsonlSource(p / "metrics.jsonl")
        if list(p.glob("*.wandb")) or list(p.glob("*/*.wandb")) or (p / "latest-run").exists():
            return WandbOfflineSource(p)
        raise InputError("a directory without metrics.jsonl or a .wandb file", path=src,
                         field="--source")
    if p.suffix == ".wandb":
        return WandbOfflineSource(p)
    if p.suffix.lower() in (".csv", ".tsv"):
        return CsvSource(p)
    return JsonlSource(p)


# ----------------------------------------------------------------------------------- identity

IDENTITY_BYTES = 4096  # the first bytes that fingerprint a file (a run's first metrics line)


def file_identity(path: str | os.PathLike) -> dict | None:
    """What identifies a source file when its path changed: device, inode, size and a digest of
    its first bytes (up to 4 KiB); None if it cannot be read."""
    import hashlib
    try:
        with open_input(path) as f:
            st = os.fstat(f.fileno())
            first = f.read(IDENTITY_BYTES)
    except (OSError, InputError):
        return None
    return {"dev": st.st_dev, "inode": st.st_ino, "size": st.st_size, "n": len(first),
            "first": hashlib.sha256(first).hexdigest()}


def same_file(path: str | os.PathLike, ident: dict | None) -> bool:
    """``path`` holds the file ``ident`` was taken of (moved, renamed, copied, or grown since):
    its first ``n`` bytes have the recorded digest and it is not shorter than it was. An empty
    fingerprint (the file was empty) matches nothing."""
    import hashlib
    if not isinstance(ident, dict) or not ident.get("n"):
        return False
    try:
        n, size = int(ident["n"]), int(ident.get("size", 0))
        if not 0 < n <= IDENTITY_BYTES:
            return False
        with open_input(path) as f:
            if os.fstat(f.fileno()).st_size < size:
                return False
            first = f.read(n)
    except (OSError, KeyError, TypeError, ValueError, OverflowError, InputError):
        return False
    return len(first) == n and hashlib.sha256(first).hexdigest() == ident.get("first")


def _regular(p: Path) -> None:
    """InputError (65) when ``p`` is a FIFO, a device or a socket (ladder.io's rule for inputs:
    a source is a regular file, checked without opening it)."""
    import stat as _stat
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return
    if not _stat.S_ISREG(mode) and not _stat.S_ISDIR(mode):
        raise InputError("not a regular file (a FIFO, a device or a socket); refused", path=p,
                         field="--source")


def _summary_status(run_dir: Path) -> str | None:
    """``summary.json``'s status when the run ended (complete, diverged, failed), else None."""
    return ended_status(run_dir)  # ladder.runs: the status rule of every run reader


# ----------------------------------------------------------------------------------- JSONL


class JsonlSource:
    """Tail a metrics JSONL by byte offset; each line parsed by orjson (``ladder.io.json_line``:
    the standard library for the lines holding NaN/Infinity tokens), a poll's rows turned into
    columns of the keys the rules read (:meth:`poll_batch`)."""

    kind = "jsonl"
    poll_seconds = 1.0  # a local file: cheap to stat

    def __init__(self, path: str | os.PathLike, *, chunk_bytes: int = 4 << 20,
                 max_rows: int = 100_000):
        self.path = Path(path)
        # a poll returns at most about this many rows: a backlog is judged in slices, so memory
        # stays bounded (a block's dicts, ~4 MB of lines, and 100,000 rows as float columns,
        # ~20 MB) whatever the file's length; judging 1M rows in slices of 100,000 took 1.7 s of
        # CPU against 2.1 s in slices of 20,000 (bench/watch_follow_speed.py)
        self.max_rows = max_rows
        self.offset = 0
        self.inode: int | None = None
        self.line_no = 0
        self.max_step: int | None = None  # highest step read (to skip after a rotation)
        self.skip_through: int | None = None
        self.head = ""
        self.chunk_bytes = chunk_bytes
        self._config_sent = False
        self.moved_from: str | None = None

    def position(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "offset": self.offset,
                "inode": self.inode, "line_no": self.line_no, "max_step": self.max_step,
                "config_sent": self._config_sent, "head": self.head,
                "skip_through": self.skip_through, "identity": file_identity(self.path)}

    def finished(self) -> str | None:
        status = _summary_status(self.path.parent)
        return f"summary.json status {status}" if status else None

    def restore(self, pos: dict) -> None:
        """Continue at a saved position (a state file's ``source``), each field checked: a
        ValueError naming ``source.FIELD`` when one is not what :meth:`position` writes."""
        if pos.get("kind") != self.kind:
            return
        got = check_position(pos, JSONL_POSITION)
        moved = got["path"] != str(self.path)
        if moved and not same_file(self.path, got["identity"]):
            return  # another file: read it from its start
        self.offset = got["offset"]
        self.head = got["head"]
        self.skip_through = got["skip_through"]
        self.inode = got["inode"]
        self.line_no = got["line_no"]
        self.max_step = got["max_step"]
        self._config_sent = got["config_sent"]
        if moved:  # the same file under a new name (a copy has a new inode)
            self.moved_from = got["path"]
            try:
                self.inode = os.stat(self.path).st_ino
            except OSError:
                pass

    def _read_head(self) -> str:
        """The file's first line (up to 4 KiB): its fingerprint, since a rotated file can reuse
        the old inode number."""
        try:
            with open_input(self.path) as f:
                line = f.readline(4096)
        except (OSError, InputError):
            return ""
        return line.decode("utf-8", "replace") if line.endswith(b"\n") else ""

    def _same_head(self) -> bool:
        return not self.head or self._read_head() == self.head

    def _config(self, out: Poll) -> None:
        if self._config_sent:
            return
        cfg = self.path.parent / "config.json"
        self._config_sent = True
        if cfg.exists():
            try:
                out.configs.append(read_json(cfg))
            except InputError as e:
                out.notes.append(f"run config not read: {e}")

    def poll(self) -> Poll:
        """The rows (dicts) that arrived since the last poll, at most about ``max_rows``."""
        out = Poll()

        def take(rows: list) -> int:
            out.rows.extend(rows)
            return len(out.rows)

        self._read_blocks(out, take)
        self._after_rows(out)
        return out

    def poll_batch(self, keys, keep) -> Poll:
        """Like :meth:`poll`, but the rows as a :class:`predict.watch.Batch` of the ``keys`` and
        the keys ``keep`` accepts (``rows`` left empty): each block's rows become columns as
        soon as they are parsed, so a poll holds the dicts of one block (~4 MB) at a time."""
        from predict.watch import Batch, concat_batches
        out = Poll()
        parts: list = []

        def take(rows: list) -> int:
            parts.append(Batch.from_rows(rows, keys=keys, keep=keep))
            return sum(len(p) for p in parts)

        self._read_blocks(out, take)
        batch = concat_batches(parts) if len(parts) != 1 else parts[0]
        notes = [n for p in parts for n in p.notes]
        batch.notes = list(dict.fromkeys(notes)) if len(parts) > 1 else batch.notes
        m = int(batch.step.max()) if len(batch) else None
        if self.skip_through is not None and len(batch):  # read again after a rotation
            import numpy as np
            kept = np.flatnonzero(batch.step > self.skip_through)
            if kept.size < len(batch):
                out.notes.append(f"{len(batch) - kept.size} row(s) of steps already judged "
                                 f"skipped after the file was replaced")
            batch = batch.take(kept)
            if kept.size:
                self.skip_through = None
        self._saw_step(m)
        out.batch = batch
        return out

    def _saw_step(self, m: int | None) -> None:
        """Note ``m``, the largest step of rows just read (None: none read)."""
        if m is not None:
            self.max_step = m if self.max_step is None else max(self.max_step, m)

    def _bad_note(self, bad: int, first_bad: int | None) -> str:
        return (f"{self.path}: {bad} line(s) not a JSON object, skipped (first at line "
                f"{first_bad})")

    def _read_blocks(self, out: Poll, take) -> None:
        """Read the complete lines that arrived, in blocks of about ``chunk_bytes``, handing
        each block's rows to ``take(rows) -> rows taken so far`` until about ``max_rows`` rows
        were read (``out.more`` then); notes go to ``out``. The file is opened by
        ``ladder.io.open_input`` (a regular file, without blocking on a FIFO)."""
        if self.moved_from:
            out.notes.append(f"{self.path} is {self.moved_from} moved (same first bytes): "
                             f"continuing at byte {self.offset}, nothing judged again")
            self.moved_from = None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            out.notes.append(f"{self.path}: not there (yet); waiting")
            return
        _regular(self.path)  # a FIFO put in the file's place: an error, not a hang
        replaced = self.inode is not None and (st.st_ino != self.inode or
                                               not self._same_head())
        if self.offset and (replaced or st.st_size < self.offset):
            what = "replaced (rotated)" if replaced else "truncated"
            out.notes.append(f"{self.path} was {what}: reading it again from the start; steps "
                             f"up to {self.max_step} already judged are skipped")
            self.offset, self.line_no = 0, 0
            self.skip_through = self.max_step
            self.head = ""
        self.inode = st.st_ino
        if not self.head:
            self.head = self._read_head()
        self._config(out)
        if st.st_size <= self.offset:
            return
        bad = 0
        first_bad = None
        with open_input(self.path, field="--source") as f:
            f.seek(self.offset)
            while True:
                data = f.read(self.chunk_bytes)
                if not data:
                    break
                end = data.rfind(b"\n")
                if end < 0:
                    if len(data) < self.chunk_bytes:
                        break  # the partial last line: wait for its newline
                    data += f.readline()  # one line longer than a chunk
                    if not data.endswith(b"\n"):
                        break
                    end = len(data) - 1
                rows: list = []
                nbad, first, n_lines = parse_lines(data[:end], self.line_no, rows)
                if nbad:
                    bad += nbad
                    first_bad = first_bad or first
                self.line_no += n_lines
                self.offset += end + 1
                f.seek(self.offset)
                if take(rows) >= self.max_rows:
                    out.more = True
                    break
        if bad:
            out.notes.append(self._bad_note(bad, first_bad))

    def _after_rows(self, out: Poll) -> None:
        m = _max_step([r.get("step") for r in out.rows])
        if self.skip_through is not None:
            keep = [r for r in out.rows if (_step_of(r) or 0) > self.skip_through]
            if len(keep) < len(out.rows):
                out.notes.append(f"{len(out.rows) - len(keep)} row(s) of steps already judged "
                                 f"skipped after the file was replaced")
            out.rows = keep
            if keep:
                self.skip_through = None
        self._saw_step(m)


def parse_lines(block: bytes, line_no: int, rows: list) -> tuple[int, int | None, int]:
    """Append the JSON objects of the newline-separated ``block`` to ``rows``: each line by
    orjson, the lines it refuses by the standard library (``ladder.io.json_line``: NaN/Infinity
    tokens, numbers beyond float range); blank lines skipped, lines that are not a JSON object
    counted. Returns ``(bad, first bad line number (1-based, after line_no), lines)``."""
    lines = block.split(b"\n")
    try:  # the common case, every line an object orjson reads: one pass in C
        got = list(map(orjson.loads, lines))
        if set(map(type, got)) == {dict}:
            rows.extend(got)
            return 0, None, len(lines)
    except orjson.JSONDecodeError:
        pass
    loads, err, append = orjson.loads, orjson.JSONDecodeError, rows.append
    bad, first = 0, None
    for k, raw in enumerate(lines):
        try:
            row = loads(raw)
        except err:
            if not raw.strip():
                continue
            row, _ = json_line(raw)
        if type(row) is dict:
            append(row)
        else:
            bad += 1
            first = first or line_no + k + 1
    return bad, first, len(lines)


# A saved read position of a JSONL source, field by field: (name, kinds, bounds). A state file
# is ours, but it is a file: edited, truncated, or from another version (issue 26).
_POS_INT = (0, 2 ** 63 - 1)
JSONL_POSITION = {"path": ("str", None), "offset": ("int", _POS_INT),
                  "inode": ("int?", _POS_INT), "line_no": ("int", _POS_INT),
                  "max_step": ("int?", (0, 2 ** 53)), "skip_through": ("int?", (0, 2 ** 53)),
                  "config_sent": ("bool", None), "head": ("str", None),
                  "identity": ("dict?", None)}


def check_position(pos: dict, spec: dict) -> dict:
    """The fields of a saved read position ``pos`` as ``spec`` says (missing ones: the
    defaults of a fresh source), or a ValueError naming the first bad one (``source.FIELD``)."""
    defaults = {"str": "", "int": 0, "int?": None, "bool": False, "dict?": None}
    out = {}
    for name, (kind, bounds) in spec.items():
        v = pos.get(name, defaults[kind])
        ok = True
        if kind in ("int", "int?"):
            if v is None and kind == "int?":
                pass
            elif isinstance(v, bool) or not isinstance(v, int):
                ok = False
            elif bounds and not bounds[0] <= v <= bounds[1]:
                ok = False
        elif kind == "bool":
            ok = isinstance(v, bool)
        elif kind == "str":
            ok = isinstance(v, str) and len(v) <= 1 << 16
        elif kind == "dict?":
            ok = v is None or isinstance(v, dict)
        if not ok:
            raise ValueError(f"source.{name}: expected {kind.replace('?', ' or null')}"
                             + (f" in [{bounds[0]}, {bounds[1]}]" if bounds else "")
                             + f", got {str(v)[:40]!r}")
        out[name] = v
    return out


def _max_step(steps: list) -> int | None:
    """The highest step of the rows' ``step`` values, as :func:`_step_of` reads each."""
    try:  # the common case: every row has a finite numeric step (max runs in C)
        m = max(steps) if steps else None
        if m is not None and not math.isfinite(m):
            raise ValueError  # a NaN first compares as the max: the careful way
        return int(m) if m is not None else None
    except (TypeError, ValueError, OverflowError):
        got = [s for s in (_step_value(v) for v in steps) if s is not None]
        return max(got) if got else None


def _step_of(row: dict) -> int | None:
    return _step_value(row.get("step"))


def _step_value(s) -> int | None:
    f = as_float(s)
    if f is None or not math.isfinite(f):
        return None
    return int(f)


# ----------------------------------------------------------------------------------- CSV


class CsvSource:
    """A CSV of metrics (read whole each poll; rows already returned are not returned again)."""

    kind = "csv"
    poll_seconds = 1.0

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.n_rows = 0
        self.size = 0

    def position(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "n_rows": self.n_rows,
                "size": self.size, "identity": file_identity(self.path)}

    def finished(self) -> str | None:
        status = _summary_status(self.path.parent)
        return f"summary.json status {status}" if status else None

    def restore(self, pos: dict) -> None:
        if pos.get("kind") != self.kind:
            return
        got = check_position(pos, {"path": ("str", None), "n_rows": ("int", _POS_INT),
                                   "size": ("int", _POS_INT), "identity": ("dict?", None)})
        if got["path"] == str(self.path) or same_file(self.path, got["identity"]):
            self.n_rows, self.size = got["n_rows"], got["size"]

    def poll(self) -> Poll:
        import pandas as pd
        out = Poll()
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            out.notes.append(f"{self.path}: not there (yet); waiting")
            return out
        if size == self.size:
            return out
        if size < self.size:
            out.notes.append(f"{self.path} shrank: reading it again from the start")
            self.n_rows = 0
        self.size = size
        try:
            with open_input(self.path, field="--source") as f:
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1] if b"\n" in data else b""
            import io
            df = pd.read_csv(io.BytesIO(complete), sep=None if self.path.suffix == ".tsv"
                             else ",", engine="c" if self.path.suffix != ".tsv" else "python",
                             dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError,
                ValueError, OverflowError) as e:
            if isinstance(e, pd.errors.EmptyDataError):
                return out
            raise InputError(f"not a readable CSV ({str(e).splitlines()[0]})",
                             path=self.path) from None
        df = normalise_columns(df)
        if "step" not in df.columns:
            raise InputError("no step column (expected 'step', '_step' or 'Step')",
                             path=self.path, field="step")
        new = df.iloc[self.n_rows:]
        self.n_rows = len(df)
        for rec in new.to_dict("records"):
            out.rows.append({k: (None if v == "" else v) for k, v in rec.items()})
        return out


def normalise_columns(df):
    """W&B exports: ``_step``/``Step`` -> ``step``; ``<run name> - <key>`` -> ``<key>``;
    ``__MIN``/``__MAX`` companion columns (chart exports) dropped."""
    cols = {}
    for c in df.columns:
        name = str(c)
        if name.endswith(("__MIN", "__MAX")):
            continue
        if name in ("_step", "Step") and "step" not in df.columns:
            cols[c] = "step"
        elif " - " in name and "/" in name.split(" - ", 1)[1]:
            cols[c] = name.split(" - ", 1)[1]
        else:
            cols[c] = name
    df = df[list(cols)].rename(columns=cols)
    return df.loc[:, ~df.columns.duplicated()]


# ----------------------------------------------------------------------------------- W&B offline


def wandb_executable() -> str | None:
    exe = Path(sys.executable).parent / "wandb"
    if exe.exists():
        return str(exe)
    return shutil.which("wandb")


class WandbOfflineSource:
    """A W&B offline run: a directory (``wandb/``, a ``run-*`` directory) or one ``.wandb`` file.

    Every ``.wandb`` segment below the directory is read, in lineage order (a resumed run writes
    a new ``run-<time>-<id>`` directory; the names sort by time), each incrementally: the byte
    offset after its last complete record is kept, so a poll decodes only what was appended
    (not the whole file again) and a restarted watcher continues there. A later segment's row
    for a step replaces an earlier one downstream (last one wins). The run finished when the
    newest segment holds W&B's exit record."""

    kind = "wandb-offline"
    poll_seconds = 2.0  # W&B flushes its offline log every few seconds

    def __init__(self, path: str | os.PathLike, *, use_leet: bool | None = None):
        self.path = Path(path)
        self.use_leet = use_leet  # True: `wandb leet inspect --json` (reads whole files)
        self.segs: dict[str, dict] = {}  # segment name -> {"offset", "num", "exit"}
        self._config_sent = False

    def position(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "segments": self.segs,
                "config_sent": self._config_sent}

    def restore(self, pos: dict) -> None:
        if pos.get("kind") == self.kind and isinstance(pos.get("segments"), dict):
            # names are relative to the watched directory: a moved directory still matches
            self.segs = {str(k): {"offset": int(v.get("offset", 0)), "num": int(v.get("num", 0)),
                                  "exit": bool(v.get("exit"))}
                         for k, v in pos["segments"].items() if isinstance(v, dict)}
            self._config_sent = bool(pos.get("config_sent"))

    def segments(self) -> list[tuple[str, Path]]:
        """(name, path) of every .wandb file of the run, oldest first."""
        p = self.path
        if p.is_file():
            return [(p.name, p)]
        found: dict[Path, str] = {}
        for q in sorted(p.glob("*.wandb")) + sorted(p.glob("*/*.wandb")):
            if q.parent.name == "latest-run" and q.parent != p:
                continue  # a link to one of the run-* directories (unless it is the one given)
            found.setdefault(q.resolve(), str(q.relative_to(p)))
        if not found and (p / "latest-run").exists():
            for q in sorted((p / "latest-run").glob("*.wandb")):
                found.setdefault(q.resolve(), str(q.relative_to(p)))
        if not found:
            raise InputError("no .wandb record file", path=p, field="--source",
                             exit_code=EX_NOINPUT)
        # run-YYYYMMDD_HHMMSS-ID/run-ID.wandb: the directory names sort by start time
        return sorted(((name, q) for q, name in found.items()),
                      key=lambda t: (Path(t[0]).parent.name, Path(t[0]).name))

    def record_file(self) -> Path:
        """The newest segment."""
        return self.segments()[-1][1]

    def finished(self) -> str | None:
        segs = self.segments()
        last = self.segs.get(segs[-1][0]) if segs else None
        return "W&B exit record" if last and last.get("exit") else None

    def _leet(self, f: Path) -> list[dict] | None:
        exe = wandb_executable() if self.use_leet is not False else None
        if not exe:
            return None
        try:
            proc = subprocess.run([exe, "leet", "inspect", "--json", str(f)],
                                  capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if proc is not None and proc.returncode == 0 and proc.stdout.strip():
            out = []
            for line in proc.stdout.splitlines():
                try:
                    out.append(json.loads(line))
                except (ValueError, RecursionError):
                    continue
            return out
        if self.use_leet:
            raise InputError("`wandb leet inspect --json` failed: "
                             + (proc.stderr.decode(errors="replace").strip()[:200]
                                if proc else "not runnable"), path=f)
        return None

    def poll(self) -> Poll:
        out = Poll()
        for name, f in self.segments():
            seg = self.segs.setdefault(name, {"offset": 0, "num": 0, "exit": False})
            try:
                size = f.stat().st_size
            except OSError:
                continue
            if size < seg["offset"]:  # rewritten: read again, the steps repeat downstream
                out.notes.append(f"{f} shrank: reading it again from the start")
                seg.update(offset=0, num=0)
            if size == seg["offset"]:
                continue
            if self.use_leet:
                recs = [r for r in (self._leet(f) or []) if int(r.get("num", 0) or 0) > seg["num"]]
                end, bad = size, 0
            else:
                recs, end, bad = decode_wandb_file(f, seg["offset"])
            if bad:
                if not recs and seg["offset"] == 0:
                    raise InputError(f"not a readable W&B record log ({bad} corrupt "
                                     f"record(s), none readable)", path=f, field="--source")
                out.notes.append(f"{f}: {bad} corrupt record(s) skipped near byte {end}")
            seg["offset"] = end
            self._take(recs, seg, out)
        return out

    def _take(self, recs: Iterable[dict], seg: dict, out: Poll) -> None:
        for rec in recs:
            num = int(rec.get("num", 0) or 0)
            typ = rec.get("type")
            if typ == "run" and not self._config_sent:
                cfg = _config_from_update((rec.get("run") or {}).get("config") or {})
                if cfg:
                    out.configs.append(cfg)
                self._config_sent = True
            elif typ == "config":
                cfg = _config_from_update(rec.get("config") or {})
                if cfg:
                    out.configs.append(cfg)
            elif typ == "history":
                h = rec.get("history") or {}
                row = dict(h.get("item") or {})
                step = (h.get("step") or {}).get("num", row.get("_step"))
                row["step"] = step
                out.rows.append(row)
            elif typ == "exit":
                seg["exit"] = True
            seg["num"] = max(seg["num"], num)


def _config_from_update(cfg: dict) -> dict:
    upd = cfg.get("update", cfg) if isinstance(cfg, dict) else {}
    if isinstance(upd, list):  # protobuf-shaped: [{"key", "value_json"}]
        d = {}
        for item in upd:
            try:
                d[item.get("key")] = json.loads(item.get("value_json", "null"))
            except ValueError:
                continue
        upd = d
    return {k: v for k, v in upd.items() if k != "_wandb"} if isinstance(upd, dict) else {}


# The .wandb file: a 7-byte header (":W&B", a 2-byte magic, a version byte), then the LevelDB log
# format: 32 KiB blocks of records, each a 7-byte header (CRC32C, uint16 length, type: 1 full,
# 2 first, 3 middle, 4 last) and a payload; a block tail under 7 bytes is zero padding. The
# payloads are ``wandb_internal_pb2.Record`` protobufs. (LevelDB log format: leveldb's
# doc/log_format.md.)
_BLOCK = 32768


def read_wandb_records(path: str | os.PathLike, *, full: bool = False) -> Iterable[dict]:
    """Decode a whole .wandb record log (see :func:`decode_wandb_file`). ``full``: every
    record type whole (protobuf's own dict of it: a run's group, name, job type and tags, a
    metric's definition), not only the history and config the watcher reads."""
    recs, _, _ = decode_wandb_file(Path(path), 0, full=full)
    return recs


def decode_wandb_file(path: Path, start: int = 0, *, full: bool = False
                      ) -> tuple[list[dict], int, int]:
    """Records of a .wandb log from byte ``start`` (0, or an offset this function returned):
    ``(records, end, corrupt)``, ``end`` being the offset after the last complete record (a
    truncated last record of a live run is left for the next call). The CRC is not checked;
    a record header that cannot be one (an unknown type, a length past its block) is corrupt:
    counted, and the rest of the file is skipped (a log cannot be resynchronised reliably)."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open_input(path, field="--source") as fh:
        fh.seek(start)
        data = fh.read()
    if start == 0:
        if len(data) < 7:
            return [], 0, 0
        if data[:4] != b":W&B":
            raise InputError("not a W&B record file (bad header)", path=path, field="--source")
        pos = 7
    else:
        pos = 0
    recs: list[dict] = []
    bad = 0
    buf = b""
    end = pos
    while pos + 7 <= len(data):
        abs_pos = start + pos
        block_left = _BLOCK - (abs_pos % _BLOCK)
        if block_left < 7:  # zero padding at a block's end
            pos += block_left
            if not buf:
                end = pos
            continue
        _crc, length, typ = struct.unpack("<IHB", data[pos:pos + 7])
        if typ == 0 and length == 0:  # a zero-filled block tail: skip to the next block
            pos += block_left
            if not buf:
                end = pos
            continue
        if typ not in (1, 2, 3, 4) or 7 + length > block_left:
            bad += 1
            break
        body = pos + 7
        if body + length > len(data):
            break  # a record still being written
        payload = data[body:body + length]
        pos = body + length
        if typ == 1:
            buf = payload
        elif typ == 2:
            buf = payload
            continue
        elif typ == 3:
            buf += payload
            continue
        else:
            buf += payload
        rec = pb.Record()
        try:
            rec.ParseFromString(buf)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError: a corrupt record, skipped
            bad += 1
            buf, end = b"", pos
            continue
        buf, end = b"", pos
        recs.append(_record_dict(rec, full))
    return recs, start + end, bad


def _record_dict(rec, full: bool = False) -> dict:
    which = rec.WhichOneof("record_type")
    d: dict[str, Any] = {"num": rec.num, "type": which}
    if full and which not in ("history", None):
        from google.protobuf.json_format import MessageToDict  # protobuf comes with wandb
        d[which] = MessageToDict(getattr(rec, which), preserving_proto_field_name=True)
        return d
    if which == "history":
        item = {}
        for it in rec.history.item:
            key = it.key or "/".join(it.nested_key)
            item[key] = _history_value(it)
        d["history"] = {"item": item, "step": {"num": rec.history.step.num}}
    elif which in ("run", "config"):
        cfg_msg = rec.run.config if which == "run" else rec.config
        upd = {}
        for it in cfg_msg.update:
            key = it.key or "/".join(it.nested_key)
            try:
                upd[key] = json.loads(it.value_json)
            except (ValueError, RecursionError):
                upd[key] = it.value_json
        d[which] = {"config": {"update": upd}} if which == "run" else {"update": upd}
    elif which in ("exit",):
        d[which] = {}
    return d


def _history_value(it) -> Any:
    which = it.WhichOneof("value") if any(f.containing_oneof for f in it.DESCRIPTOR.fields) \
        else None
    if which and which != "value_json":
        v = getattr(it, which)
        if which == "none":
            return None
        return v
    try:
        return json.loads(it.value_json)
    except (ValueError, RecursionError):
        return it.value_json


# ----------------------------------------------------------------------------------- W&B API


@dataclass(frozen=True)
class WandbUri:
    entity: str
    project: str
    run_ids: tuple[str, ...]

    @classmethod
    def parse(cls, uri: str) -> WandbUri:
        if not uri.startswith("wandb://"):
            raise InputError("expected wandb://ENTITY/PROJECT/RUN_ID[,RUN_ID...]",
                             field="--source", exit_code=64)
        parts = uri[len("wandb://"):].strip("/").split("/")
        if len(parts) != 3 or not all(parts):
            raise InputError(f"expected wandb://ENTITY/PROJECT/RUN_ID[,RUN_ID...], got {uri!r}",
                             field="--source", exit_code=64)
        ids = tuple(i.strip() for i in parts[2].split(",") if i.strip())
        if not ids:
            raise InputError("no run id", field="--source", exit_code=64)
        return cls(parts[0], parts[1], ids)


class WandbApiSource:
    """Runs of one lineage through the W&B public API (``api`` injectable for tests).

    The first poll reads every id's history in lineage order; later polls read the last id's new
    rows (``min_step`` past the last step seen). Rows are passed on in lineage order, so a step
    logged again by a later run replaces the earlier one downstream (last one wins)."""

    kind = "wandb-api"
    # W&B's public API is rate-limited (per user and minute); a minute between polls is what a
    # run logged every few minutes needs, and what a 100-day follow can afford
    poll_seconds = 60.0

    def __init__(self, uri: str, *, api: Any = None, page_size: int = 1000):
        self.uri = WandbUri.parse(uri)
        self._api = api
        self.page_size = page_size
        self.last_step: dict[str, int] = {}
        self.done_ids: list[str] = []
        self._config_sent = False
        self.runs: dict[str, Any] = {}

    @property
    def api(self):
        if self._api is None:
            try:
                import wandb
                self._api = wandb.Api(timeout=30)
            except Exception as e:  # noqa: BLE001 - no network / no login: one clear line
                raise InputError(f"cannot reach the W&B API ({type(e).__name__}: {e})",
                                 field="--source", exit_code=69) from None
        return self._api

    def position(self) -> dict:
        return {"kind": self.kind, "uri": list(self.uri.run_ids), "last_step": self.last_step,
                "done_ids": self.done_ids, "config_sent": self._config_sent}

    def restore(self, pos: dict) -> None:
        if pos.get("kind") == self.kind and pos.get("uri") == list(self.uri.run_ids):
            self.last_step = {k: int(v) for k, v in (pos.get("last_step") or {}).items()}
            self.done_ids = list(pos.get("done_ids") or [])
            self._config_sent = bool(pos.get("config_sent"))

    def run(self, run_id: str):
        if run_id not in self.runs:
            path = f"{self.uri.entity}/{self.uri.project}/{run_id}"
            try:
                self.runs[run_id] = self.api.run(path)
            except InputError:
                raise
            except Exception as e:  # noqa: BLE001
                raise InputError(f"W&B run {path} not readable ({type(e).__name__}: {e})",
                                 field="--source", exit_code=69) from None
        return self.runs[run_id]

    def finished(self) -> str | None:
        """The lineage's newest run's state, when W&B says it ended."""
        run = self.run(self.uri.run_ids[-1])
        try:
            if hasattr(run, "load"):  # refresh the run's state from the server
                run.load(force=True)
        except TypeError:
            run.load()
        state = getattr(run, "state", None)
        return f"W&B run state {state}" if state in ("finished", "crashed", "failed",
                                                      "killed") else None

    def poll(self) -> Poll:
        try:
            return self._poll()
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - the API's errors (HTTP, timeouts) vary by version
            raise InputError(f"W&B API error ({type(e).__name__}: {str(e)[:160]})",
                             field="--source", exit_code=69) from None

    def _poll(self) -> Poll:
        out = Poll()
        ids = self.uri.run_ids
        for k, rid in enumerate(ids):
            if rid in self.done_ids:
                continue
            run = self.run(rid)
            if k == len(ids) - 1 and not self._config_sent:
                cfg = dict(getattr(run, "config", {}) or {})
                if cfg:
                    out.configs.append({key: v for key, v in cfg.items() if key != "_wandb"})
                self._config_sent = True
            start = self.last_step.get(rid)
            kw = {"page_size": self.page_size}
            if start is not None:
                kw["min_step"] = start + 1
            for row in run.scan_history(**kw):
                row = dict(row)
                step = row.get("_step")
                if "step" not in row:
                    row["step"] = step
                s = _step_of(row)
                if s is None:
                    continue
                if start is not None and s <= start:
                    continue
                out.rows.append(row)
                self.last_step[rid] = max(self.last_step.get(rid, s), s)
            if k < len(ids) - 1:  # an earlier run of the lineage (superseded): read once
                self.done_ids.append(rid)
        return out
