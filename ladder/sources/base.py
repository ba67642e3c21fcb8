"""What every watcher source shares: the :class:`Source` shape, the :class:`Poll` a poll returns,
a source file's identity (a moved file is recognised) and the check of a saved read position."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ladder.io import InputError, open_input
from ladder.sources.runs import ended_status


@dataclass
class Poll:
    rows: list[dict] = field(default_factory=list)
    configs: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    more: bool = False  # the source has more rows ready: poll again at once
    # the rows start over (a file replaced or truncated): the watcher skips the judged steps
    restarted: bool = False
    batch: Any = None   # rows already as columns (predict.watch.Batch), when the source made them


class Source:
    """The shape of a watcher source (``ladder.predict.live.Watcher`` asks for nothing else).

    ``poll()``: a :class:`Poll` of what arrived since the last poll. ``position()``: a
    JSON-serialisable read position that ``restore()`` continues at (True when it can).
    ``finished()``: in words, that the run ended (None while it runs or when unknown).
    ``poll_seconds``: the interval that suits the source when following."""

    kind = "source"
    poll_seconds = 1.0

    def poll(self) -> Poll:
        raise NotImplementedError

    def poll_batch(self, keys, keep) -> Poll:
        """The next rows as columns of ``keys`` and the keys ``keep`` accepts (``Poll.batch``),
        for a source that makes them; this default leaves them as rows."""
        return self.poll()

    def position(self) -> dict:
        return {"kind": self.kind}

    def restore(self, pos: dict) -> bool:
        """Continue at ``pos`` (a :meth:`position`): True; False when reading from the start
        instead (the watcher then skips the rows already judged)."""
        return False

    def finished(self) -> str | None:
        return None


class SourceWrapper(Source):
    """A source passed through to ``source`` (every attribute the wrapped source's); a subclass
    changes the polls."""

    def __init__(self, source: Source):
        self._source = source
        self.kind, self.poll_seconds = source.kind, source.poll_seconds  # a source's constants

    def __getattr__(self, name):  # the wrapped source's own attributes (path, uri...)
        if name == "_source":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._source, name)

    def poll(self) -> Poll:
        return self._source.poll()

    def poll_batch(self, keys, keep) -> Poll:
        return self._source.poll_batch(keys, keep)

    def position(self) -> dict:
        return self._source.position()

    def restore(self, pos: dict) -> bool:
        return bool(self._source.restore(pos))

    def finished(self) -> str | None:
        return self._source.finished()


def summary_finished(run_dir: Path) -> str | None:
    """``summary.json status S`` when the run of ``run_dir`` ended (:func:`ended_status`)."""
    status = ended_status(run_dir)
    return f"summary.json status {status}" if status else None


# ----------------------------------------------------------------------------------- identity

IDENTITY_BYTES = 4096  # the first bytes that fingerprint a file (a run's first metrics line)


def file_identity(path: str | os.PathLike) -> dict | None:
    """What identifies a source file whose path changed: device, inode, size and a digest of
    its first bytes; None if it cannot be read."""
    try:
        with open_input(path) as f:
            st = os.fstat(f.fileno())
            first = f.read(IDENTITY_BYTES)
    except (OSError, InputError):
        return None
    return {"dev": st.st_dev, "inode": st.st_ino, "size": st.st_size, "n": len(first),
            "first": hashlib.sha256(first).hexdigest()}


def same_file(path: str | os.PathLike, ident: dict | None) -> bool:
    """``path`` holds the file ``ident`` was taken of (moved, copied or grown since): its first
    ``n`` bytes have the recorded digest and it is not shorter. An empty file matches nothing."""
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


def check_regular(p: Path) -> None:
    """InputError (65) when ``p`` is a FIFO, a device or a socket (checked without opening it)."""
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise InputError("not a regular file (a FIFO, a device or a socket); refused", path=p,
                         field="--source")


# ----------------------------------------------------------------------------------- positions

# A saved read position is checked field by field: a state file may be edited (issue 26).
POS_INT = (0, 2 ** 63 - 1)


def check_position(pos: dict, spec: dict) -> dict:
    """The fields of a saved position ``pos`` as ``spec`` (name -> (kind, bounds)) says, missing
    ones a fresh source's; a ValueError naming the first bad one (``source.FIELD``)."""
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
