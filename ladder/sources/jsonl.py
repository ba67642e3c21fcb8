"""The metrics JSONL source: a run's ``metrics.jsonl`` tailed by byte offset. A partial last line
waits for its newline; a corrupt line is skipped with a note; a truncated or replaced (rotated)
file is read again from its start (``Poll.restarted``). A watcher started again with its
``--state`` continues at the saved offset (a moved file is recognised by its first bytes)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from ladder.io import (
    MAX_LINE_BYTES,
    InputError,
    json_line,
    open_input,
    read_json,
    skip_line,
    step_of,
)
from ladder.sources.base import (
    POS_INT,
    Poll,
    Source,
    check_position,
    check_regular,
    file_identity,
    same_file,
    summary_finished,
)


class JsonlSource(Source):
    """Tail a metrics JSONL by byte offset (lines parsed as ``ladder.io.json_line`` does)."""

    kind = "jsonl"
    poll_seconds = 1.0  # a local file: cheap to stat

    def __init__(self, path: str | os.PathLike, *, chunk_bytes: int = 4 << 20,
                 max_rows: int = 100_000):
        self.path = Path(path)
        # a poll returns at most about this many rows: a backlog is judged in slices, memory
        # bounded (~20 MB of columns); 1M rows took 1.7 s of CPU in slices of 100,000, 2.1 s in
        # slices of 20,000 (bench/watch_follow_speed.py)
        self.max_rows = max_rows
        self.offset = 0
        self.inode: int | None = None
        self.line_no = 0
        self.max_step: int | None = None  # highest step read
        self.restarted = False  # read again from the start: said in the next poll
        self.head = ""
        self.chunk_bytes = chunk_bytes
        self._config_sent = False
        self.moved_from: str | None = None

    def position(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "offset": self.offset,
                "inode": self.inode, "line_no": self.line_no, "max_step": self.max_step,
                "config_sent": self._config_sent, "head": self.head,
                "identity": file_identity(self.path)}

    def finished(self) -> str | None:
        return summary_finished(self.path.parent)

    def restore(self, pos: dict) -> bool:
        """Continue at a saved position, each field checked (ValueError naming ``source.FIELD``);
        False for another kind's position or another file."""
        if pos.get("kind") != self.kind:
            return False
        got = check_position(pos, JSONL_POSITION)
        moved = got["path"] != str(self.path)
        if moved and not same_file(self.path, got["identity"]):
            return False  # another file: read it from its start
        for name in ("offset", "head", "inode", "line_no", "max_step"):
            setattr(self, name, got[name])
        self._config_sent = got["config_sent"]
        if moved:  # the same file under a new name (a copy has a new inode)
            self.moved_from = got["path"]
            try:
                self.inode = os.stat(self.path).st_ino
            except OSError:
                pass
        return True

    def _read_head(self) -> str:
        """The file's first line (up to 4 KiB): a rotated file can reuse the old inode number."""
        try:
            with open_input(self.path) as f:
                line = f.readline(4096)
        except (OSError, InputError):
            return ""
        return line.decode("utf-8", "replace") if line.endswith(b"\n") else ""

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
        self._saw_step(_max_step([r.get("step") for r in out.rows]))
        return out

    def poll_batch(self, keys, keep) -> Poll:
        """:meth:`poll` as a :class:`Batch` of ``keys`` and the keys ``keep`` accepts, each block's
        rows made columns once parsed (a poll holds one block's dicts at a time)."""
        from ladder.sources.batch import Batch, concat_batches
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
        self._saw_step(m)
        out.batch = batch
        return out

    def _saw_step(self, m: int | None) -> None:
        """Note ``m``, the largest step of rows just read (None: none read)."""
        if m is not None:
            self.max_step = m if self.max_step is None else max(self.max_step, m)

    def _read_blocks(self, out: Poll, take) -> None:
        """Read the complete lines that arrived in blocks of about ``chunk_bytes``, each block's
        rows handed to ``take(rows) -> rows taken so far`` until about ``max_rows`` (then
        ``out.more``); notes go to ``out``."""
        if self.moved_from:
            out.notes.append(f"{self.path} is {self.moved_from} moved (same first bytes): "
                             f"continuing at byte {self.offset}, nothing judged again")
            self.moved_from = None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            out.notes.append(f"{self.path}: not there (yet); waiting")
            return
        check_regular(self.path)  # a FIFO put in the file's place: an error, not a hang
        replaced = self.inode is not None and (
            st.st_ino != self.inode or bool(self.head) and self._read_head() != self.head)
        if self.offset and (replaced or st.st_size < self.offset):
            what = "replaced (rotated)" if replaced else "truncated"
            out.notes.append(f"{self.path} was {what}: reading it again from the start")
            self.offset, self.line_no = 0, 0
            self.restarted = True
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
                    # one line longer than a chunk, read up to MAX_LINE_BYTES; a longer one is
                    # read past in pieces and counted as corrupt (memory stays bounded)
                    data += f.readline(max(MAX_LINE_BYTES + 1 - len(data), 1))
                    if len(data) > MAX_LINE_BYTES and not data.endswith(b"\n"):
                        rest = skip_line(f)
                        if rest is None:
                            break  # still being written: judged once it ends
                        self.offset += len(data) + rest
                        self.line_no += 1
                        bad += 1
                        first_bad = first_bad or self.line_no
                        f.seek(self.offset)
                        continue
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
            out.notes.append(f"{self.path}: {bad} line(s) not a JSON object, skipped (first at "
                             f"line {first_bad})")
        if self.restarted:
            out.restarted, self.restarted = True, False


def parse_lines(block: bytes, line_no: int, rows: list) -> tuple[int, int | None, int]:
    """Append the JSON objects of the lines of ``block`` to ``rows`` (``ladder.io.json_line``,
    orjson's fast path first); blank lines skipped, others counted as bad. Returns ``(bad, first
    bad line number (1-based, after line_no), lines)``."""
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


# A saved read position of a JSONL source, field by field (ladder.sources.base.check_position)
JSONL_POSITION = {"path": ("str", None), "offset": ("int", POS_INT),
                  "inode": ("int?", POS_INT), "line_no": ("int", POS_INT),
                  "max_step": ("int?", (0, 2 ** 53)),
                  "config_sent": ("bool", None), "head": ("str", None),
                  "identity": ("dict?", None)}


def _max_step(steps: list) -> int | None:
    """The highest of the rows' valid steps (:func:`ladder.io.step_of`)."""
    try:  # the common case, every step valid: max runs in C, and a valid max is the answer
        top = step_of(max(steps, default=None))
    except TypeError:  # a missing step or a string among the numbers
        top = None
    if top is None:
        top = max((s for s in map(step_of, steps) if s is not None), default=None)
    return top
