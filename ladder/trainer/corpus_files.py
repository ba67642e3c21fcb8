"""What the two corpus readers (:mod:`ladder.trainer.data`, :mod:`ladder.trainer.tokens`) share:
which files a ``--data`` argument names, which documents are held out for evaluation, the token
dtype and the held-out windows. Kept below both, so the corpus may dispatch to the shard reader
without an import cycle.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path

import numpy as np

from ladder.io import EX_DATAERR, EX_NOINPUT, InputError

VAL_BUCKETS = 20          # one document in 20 (by path hash) is held out: ~5% of the corpus
TAIL_VAL_FRACTION = 0.05  # a single stream (one file, a token array) holds out its last 5%


def is_held_out(name: str) -> bool:
    """A document is held out when sha256 of its name falls in bucket 0 of ``VAL_BUCKETS``."""
    h = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") % VAL_BUCKETS == 0


def token_dtype(vocab: int) -> np.dtype:
    """uint16 holds ids below 65,536 (GPT-2-sized vocabularies); larger ones need uint32."""
    return np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)


def windows(stream, starts: np.ndarray, seq_len: int) -> dict:
    """``tokens`` and next-token ``targets`` (int32 [B, S]) of the windows of ``stream`` at
    ``starts``."""
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]  # [B, S+1]
    w = np.asarray(stream[idx], dtype=np.int32)
    return {"tokens": w[:, :-1], "targets": w[:, 1:]}


def eval_windows(stream, n_batches: int, batch: int, seq_len: int) -> list[dict]:
    """The fixed held-out set: ``n_batches x batch`` evenly spaced windows of ``stream`` (the
    validation split), the same whatever the seed and the batch."""
    starts = np.linspace(0, len(stream) - seq_len - 1, n_batches * batch).astype(np.int64)
    return [windows(stream, starts[i * batch:(i + 1) * batch], seq_len)
            for i in range(n_batches)]


def data_files(patterns: tuple[str, ...]) -> list[Path]:
    """The files that ``--data``'s paths and globs name, in order (directories a glob meets are
    skipped); a pattern that matches nothing, a directory named as such, patterns that match
    only directories, and a match that is not a regular file (a FIFO, a device: reading it
    would block or never end) are an InputError."""
    files: list[Path] = []
    for pat in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pat), recursive=True))
        if not hits:
            raise InputError("no such file (or the glob matched nothing)", path=pat,
                             field="data", exit_code=EX_NOINPUT)
        if not glob.has_magic(pat) and Path(hits[0]).is_dir():
            # a folder named as such (not met by a glob) is never dropped without a word
            raise InputError("is a directory; name its files (a glob such as DIR/**/*.txt) or "
                             "a `ladder tokenize` folder", path=pat, field="data",
                             exit_code=EX_NOINPUT)
        for h in hits:
            p = Path(h)
            if p.is_file():
                files.append(p)
            elif not p.is_dir():
                # a FIFO, a device, a socket or a dangling link: never dropped without a word
                # (issue 39); a directory a glob meets is passed over, as documented
                raise InputError("not a regular file (a FIFO, a device, a socket or a broken "
                                 "link); refused", path=h, field="data", exit_code=EX_DATAERR)
    if not files:
        raise InputError("matched only directories", path=",".join(patterns), field="data",
                         exit_code=EX_NOINPUT)
    return files
