"""A persisted memo of a metrics JSONL's polls, so that a watcher started again without its state
(``ladder watch`` run once an hour, a follow restarted with a fresh ``--state``) reads only what
is new: ``JsonlSource.poll_batch`` looks here before it parses.

An entry is one poll's result (the :class:`predict.watch.Batch` of its rows, its bad-line count,
the offsets and line numbers it moved between) stored only when a fresh read would give that
same poll on any later state of the file: the poll began at a line start, every chunk it read was
a full ``chunk_bytes`` read and it stopped because it had ``max_rows`` rows, not at the end of the
file. Its output is then a function of the bytes it read alone, so replaying the entry IS
parsing them, provided those bytes are still the same. The last poll of a backlog (it read to
the file's end) is kept as a *tail* entry when it read ``TAIL_MIN_ROWS`` rows or more: it holds
only while the file is exactly as long as it was (a finished run judged again), and the next
poll from its start replaces it. That is checked before each replay: the
file's inode and first line, its size, and a CRC-32 of every byte the poll read (zlib over a
memory map: ~0.3 s per GB, a third of SHA-1's cost here; an accidental rewrite that kept inode,
first line and length and collided in the CRC would go unseen, a 1 in 4e9 chance). A mismatch
drops that entry and every later one; a truncated, rotated or rewritten file is read again and
the cache rebuilt.

Only the one-process read writes entries: where ``JsonlSource.poll_batch`` parses a large
backlog with its process pool (4 cores or more), the pool's one batch is not a poll a serial read
would make, so that read is not kept (the cache is replayed there all the same).

Entries live beside the metrics file in ``.<name>.watch-cache/<spec>/`` (``spec``: a digest of
what shapes a poll: the keys read, ``chunk_bytes``, ``max_rows`` and the code of the readers), one
``.npy`` per entry and an ``index.json``, each written atomically; a directory that cannot be
written means no cache (logged), never a failed watch.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import mmap
import os
import shutil
import zlib
from pathlib import Path

import numpy as np

from ladder.io import InputError, atomic_write_bytes, atomic_write_json

SCHEMA = "watch-column-cache/1"
# a poll that stopped at the file's end is kept only with this many rows: a follow's polls of a
# few rows each would rewrite the cache every second for nothing (the next watcher re-reads the
# tail from the last entry anyway)
TAIL_MIN_ROWS = 1000
log = logging.getLogger("ladder")

# the modules whose code decides a poll's output: a change to any of them is a new cache
_CODE = ("jsonl_columns.py", "watch/batch.py", "sources.py", "column_cache.py")


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in _CODE:
        try:
            h.update((here / name).read_bytes())
        except OSError:  # installed without sources: the package's version stands for them
            from importlib.metadata import PackageNotFoundError, version
            try:
                h.update(f"{name}:{version('ladder')}".encode())
            except PackageNotFoundError:
                h.update(name.encode())
    return h.hexdigest()


def spec_of(keys, keep, *, chunk_bytes: int, max_rows: int) -> dict | None:
    """What shapes a poll besides the file's bytes; None when ``keep`` is not a
    :class:`predict.watch.batch.KeyFilter` (an arbitrary callable has no stable description)."""
    from predict.watch.batch import KeyFilter
    if keep is not None and not isinstance(keep, KeyFilter):
        return None
    return {"keys": None if keys is None else sorted(keys),
            "keep": None if keep is None else {"fixed": sorted(keep.fixed),
                                               "prefixes": list(keep.prefixes)},
            "chunk_bytes": int(chunk_bytes), "max_rows": int(max_rows), "code": _code_digest()}


def crc_range(path: str | os.PathLike, start: int, stop: int) -> int:
    """CRC-32 of bytes [start, stop) of the file at ``path``, read through a memory map (no copy:
    ~3 GB/s from the page cache, where reading the bytes first costs as much again)."""
    with open(path, "rb") as f:
        if stop <= start:
            return 0
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            with memoryview(mm)[start:stop] as view:
                return zlib.crc32(view)


class ColumnCache:
    """The memo of one metrics file's polls under one spec (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, spec: dict, directory: str | os.PathLike | None
                 = None):
        self.path = Path(path)
        self.spec = spec
        tag = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        if directory is None:
            base = self.path.parent / f".{self.path.name}.watch-cache"
        else:  # one folder may hold the caches of many files (`ladder watch --column-cache DIR`)
            where = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:12]
            base = Path(directory) / f"{self.path.name}-{where}"
        self.dir = base / tag
        self.disabled = False
        self._index: dict | None = None

    # ------------------------------------------------------------------ index
    def _load(self, inode: int, head: str) -> dict:
        if self._index is not None and self._index["inode"] == inode and \
                self._index["head"] == _digest(head):
            return self._index
        idx = None
        try:
            with open(self.dir / "index.json", "rb") as f:
                idx = json.load(f)
        except (OSError, ValueError):
            idx = None
        if not (isinstance(idx, dict) and idx.get("schema") == SCHEMA and
                idx.get("spec") == self.spec and idx.get("inode") == inode and
                idx.get("head") == _digest(head) and isinstance(idx.get("entries"), list)):
            if idx is not None:
                self._drop_from(idx, 0)  # another file (rotated, rewritten) or another spec
            idx = {"schema": SCHEMA, "spec": self.spec, "path": str(self.path), "inode": inode,
                   "head": _digest(head), "entries": []}
        self._index = idx
        return idx

    def _drop_from(self, idx: dict, k: int) -> None:
        """Forget entries ``k..`` (their files removed; the index rewritten when it has a file)."""
        for e in idx.get("entries", [])[k:]:
            try:
                os.unlink(self.dir / str(e.get("file")))
            except (OSError, TypeError):
                pass
        idx["entries"] = idx.get("entries", [])[:k]
        if (self.dir / "index.json").exists():
            self._write_index(idx)

    def _drop_stale_siblings(self) -> None:
        """Remove the caches of this file made by other versions of the readers (the same spec
        but for its ``code``): nothing reads them again, and each is ~15% of the file's size."""
        same = {k: v for k, v in self.spec.items() if k != "code"}
        try:
            siblings = [d for d in self.dir.parent.iterdir() if d.is_dir() and d != self.dir]
        except OSError:
            return
        for d in siblings:
            try:
                with open(d / "index.json", "rb") as f:
                    spec = json.load(f).get("spec") or {}
            except (OSError, ValueError, AttributeError):
                continue
            if spec.get("code") != self.spec["code"] and \
                    {k: v for k, v in spec.items() if k != "code"} == same:
                shutil.rmtree(d, ignore_errors=True)

    def _write_index(self, idx: dict) -> None:
        try:
            atomic_write_json(self.dir / "index.json", idx)
        except InputError as e:
            self._disable(e)

    def _disable(self, e: Exception) -> None:
        if not self.disabled:
            log.info("column cache of %s not written (%s): the watcher reads the file", self.path,
                     e)
        self.disabled = True

    # ------------------------------------------------------------------ use
    def may_have(self, offset: int) -> bool:
        """Whether an entry may start at ``offset`` (no file is read once the index is: a
        follow's poll past the cached polls costs nothing here)."""
        if self.disabled:
            return False
        return self._index is None or any(e["start"] == offset for e in self._index["entries"])

    def lookup(self, offset: int, line_no: int, inode: int, head: str, size: int):
        """The entry of the poll that starts at ``offset`` (line ``line_no``) with its batch, or
        None; the bytes it read are checked against the file first."""
        if self.disabled or not head:
            return None
        idx = self._load(inode, head)
        for k, e in enumerate(idx["entries"]):
            if e["start"] != offset or e["line0"] != line_no:
                continue
            # a tail entry (its poll ended at the file's end) holds only while the file has
            # not grown: a longer file makes that poll read further
            stale = size != e["read_to"] if e.get("tail") else size < e["read_to"]
            if stale or not self._same_bytes(e):
                self._drop_from(idx, k)
                return None
            try:
                with open(self.dir / e["file"], "rb") as f:
                    batch = _batch_of([np.load(f, allow_pickle=False) for _ in range(4)])
            except (OSError, ValueError, KeyError, EOFError) as err:
                log.info("column cache entry %s not read (%s)", e["file"], err)
                self._drop_from(idx, k)
                return None
            return e, batch
        return None

    def _same_bytes(self, e: dict) -> bool:
        try:
            return crc_range(self.path, e["start"], e["read_to"]) == e["crc32"]
        except (OSError, ValueError):  # ValueError: the file shrank below the map
            return False

    def store(self, entry: dict, batch, inode: int, head: str) -> None:
        """Add the entry of a replayable poll (``entry``: start, end, read_to, line0, line1, bad,
        first_bad, max_step, tail) and its batch; a tail entry (``tail``: the poll stopped at the
        file's end) replaces the tail entry it follows on from."""
        if self.disabled or not head:
            return
        idx = self._load(inode, head)
        if idx["entries"] and idx["entries"][-1].get("tail"):
            if idx["entries"][-1]["start"] != entry["start"]:
                return  # a follow's later poll: the next watcher re-reads from the tail entry
            self._drop_from(idx, len(idx["entries"]) - 1)  # the same poll, on a longer file
        if any(e["start"] == entry["start"] for e in idx["entries"]):
            return
        if idx["entries"] and idx["entries"][-1]["end"] != entry["start"]:
            return  # entries are kept contiguous from the first one on
        if not idx["entries"] and entry["start"] != 0:
            return
        try:
            entry = {**entry, "crc32": crc_range(self.path, entry["start"], entry["read_to"])}
        except (OSError, ValueError):
            return
        if not idx["entries"]:
            self._drop_stale_siblings()
        name = f"e{entry['start']:015d}.npy"
        buf = io.BytesIO()
        for a in _arrays_of(batch):
            np.save(buf, a, allow_pickle=False)
        try:
            atomic_write_bytes(self.dir / name, buf.getvalue())
        except InputError as e:
            self._disable(e)
            return
        idx["entries"].append({**entry, "file": name})
        self._write_index(idx)


def _digest(head: str) -> str:
    return hashlib.sha256(head.encode("utf-8", "surrogatepass")).hexdigest()


def _arrays_of(batch) -> list[np.ndarray]:
    """The batch as four arrays, saved one after another in one ``.npy`` file: its names,
    configurations and notes as JSON text (Python's json: NaN and Infinity round-trip), the
    steps, the columns as rows of one float array and the non-finite masks likewise."""
    cols, nf = sorted(batch.cols), sorted(batch.nonfinite)
    n = len(batch.step)
    meta = json.dumps({"cols": cols, "nf": nf, "configs": batch.configs, "notes": batch.notes})
    return [np.array(meta), batch.step,
            np.stack([batch.cols[k] for k in cols]) if cols else np.zeros((0, n)),
            np.stack([batch.nonfinite[k] for k in nf]) if nf else np.zeros((0, n), bool)]


def _batch_of(arrays: list[np.ndarray]):
    from predict.watch import Batch
    meta_a, step, cols, nf = arrays
    meta = json.loads(str(meta_a))
    if cols.shape != (len(meta["cols"]), step.size) or nf.shape != (len(meta["nf"]), step.size):
        raise ValueError("arrays of another shape than their names")
    return Batch(step=step, cols=dict(zip(meta["cols"], cols, strict=True)),
                 nonfinite=dict(zip(meta["nf"], nf, strict=True)),
                 configs=meta["configs"], notes=meta["notes"])
