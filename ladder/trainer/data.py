"""Training data: a token stream split into train and held-out parts, and batches as pure functions.

Default corpus: the running Python's standard-library sources (test suites excluded), byte tokens
(vocab 256): it exists on every machine and needs no network. A document (file) is held out when
a hash of its path (relative to the stdlib root) says so, the same split on every run, machine
and seed. ``--data`` brings other text files (bytes, vocab 256), pre-tokenized arrays (``.npy``,
or raw ``.bin`` of uint16/uint32 with the vocab size given) or `ladder tokenize` shards.

Batch ``i`` is a pure function of ``(seed, i)``: resume is exact with no loader state to save.
The held-out set does not depend on the seed: every rung of a ladder is evaluated on the same
tokens. No JAX here.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ladder.io import EX_USAGE, InputError, sha256_file
from ladder.trainer.corpus_files import (  # noqa: F401  (the split rule, re-exported)
    TAIL_VAL_FRACTION, VAL_BUCKETS, data_files, eval_windows, is_held_out, token_dtype, windows)

BYTE_VOCAB = 256
# Directories of the standard library that are test suites or third-party packages.
STDLIB_SKIP = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                         "__pycache__"})
TOKEN_SUFFIXES = (".npy", ".bin")


@dataclass(frozen=True)
class Corpus:
    """Tokens of a corpus, split once into a training and a held-out stream (1-D integer arrays)."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    fingerprint: dict       # what the corpus was: kind, source, sizes, sha256 (for env.json)
    bytes_per_token: float | None  # 1.0 for byte tokens; None when unknown (bpb not defined)

    def batch(self, seed: int, index: int, batch: int, seq_len: int,
              rows: slice = slice(None)) -> dict:
        """Training batch ``index`` for ``seed``: ``tokens`` and ``targets`` [B, S] of windows at
        uniform random offsets drawn by a generator seeded with (seed, index); ``rows``: only
        those rows (a process of a multi-host run), as in the whole batch."""
        rng = np.random.default_rng([int(seed), int(index)])
        starts = rng.integers(0, len(self.train) - seq_len, size=batch)
        return windows(self.train, starts[rows], seq_len)

    def train_feed(self, seed: int, batch: int, seq_len: int, rows: slice) -> PureFeed:
        return PureFeed(self, seed, batch, seq_len, rows)

    def eval_batches(self, n_batches: int, batch: int, seq_len: int) -> list[dict]:
        return eval_windows(self.val, n_batches, batch, seq_len)

    def check_fits(self, seq_len: int, where: str) -> None:
        for name, part in (("train", self.train), ("validation", self.val)):
            if len(part) < seq_len + 2:
                raise InputError(f"the {name} split has {len(part)} tokens, fewer than one "
                                 f"sequence of {seq_len} + 1", path=where)


class PureFeed:
    """Training batches of a Corpus: pure functions of (seed, i), so no ``iterator`` and no
    state to checkpoint (tokens.GrainFeed: the same interface, with state)."""

    iterator = None

    def __init__(self, corpus: Corpus, seed: int, batch: int, seq_len: int, rows: slice):
        self.corpus, self.seed, self.size, self.seq_len, self.rows = \
            corpus, seed, batch, seq_len, rows

    def batch(self, index: int) -> dict:
        return self.corpus.batch(self.seed, index, self.size, self.seq_len, self.rows)

    def seek(self, index: int) -> None:
        """Continue at batch ``index`` (after a restore): nothing to do for a pure function."""

    def state_for(self, index: int) -> None:
        return None


def shuffle_bytes(batch: dict, seed: int, index: int) -> dict:
    """The ``data-swap`` fault (data silently replaced by garbage of the same alphabet): the
    tokens permuted within each sequence, unigram statistics kept, structure gone.
    Deterministic in (seed, index), as :func:`corrupt_bytes`: a faulted run resumes exactly."""
    rng = np.random.default_rng([int(seed), int(index), 0xDA7A])
    full = np.concatenate([batch["tokens"], batch["targets"][:, -1:]], axis=1)
    full = rng.permuted(full, axis=1)
    return {"tokens": full[:, :-1], "targets": full[:, 1:]}


def corrupt_bytes(batch: dict, fraction: float, vocab: int, seed: int, index: int) -> dict:
    """The ``loss-drift`` fault (a data-pipeline bug that creeps in): each token replaced, with
    probability ``fraction``, by a uniform random one."""
    rng = np.random.default_rng([int(seed), int(index), 0xD21F])
    full = np.concatenate([batch["tokens"], batch["targets"][:, -1:]], axis=1)
    noise = rng.integers(0, vocab, size=full.shape, dtype=full.dtype)
    full = np.where(rng.random(full.shape) < fraction, noise, full)
    return {"tokens": full[:, :-1], "targets": full[:, 1:]}


# ------------------------------------------------------------------------------- loading


def stdlib_files() -> tuple[Path, list[Path]]:
    """The standard library's ``.py`` files, test suites excluded, in a fixed (sorted) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP)
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    return root, files


@lru_cache(maxsize=4)
def stdlib_corpus() -> Corpus:
    root, files = stdlib_files()
    docs = [(str(f.relative_to(root)), f.read_bytes()) for f in files]
    corpus = _split_documents(docs, str(root))
    listing = "\n".join(f"{name}\t{len(data)}" for name, data in docs)
    fp = {
        "kind": "python-stdlib", "python": platform.python_version(),
        "implementation": platform.python_implementation(), "root": str(root),
        "files": len(docs), "bytes": sum(len(d) for _, d in docs),
        "sha256_files_and_sizes": hashlib.sha256(listing.encode("utf-8")).hexdigest(),
        "train_tokens": len(corpus.train), "val_tokens": len(corpus.val),
        "val_rule": f"sha256(relative path) mod {VAL_BUCKETS} == 0",
        "vocab_size": BYTE_VOCAB, "tokenizer": "bytes",
    }
    return Corpus(corpus.train, corpus.val, BYTE_VOCAB, fp, 1.0)


def _split_documents(docs: list[tuple[str, bytes]], where: str) -> Corpus:
    """Byte documents -> train/val streams by path hash, documents separated by a NUL byte;
    when the hash leaves either split empty (e.g. one file), the last 5% is held out."""
    sep = b"\0"
    train = sep.join(d for n, d in docs if not is_held_out(n))
    val = sep.join(d for n, d in docs if is_held_out(n))
    if not train or not val:
        stream = sep.join(d for _, d in docs)
        cut = int(len(stream) * (1 - TAIL_VAL_FRACTION))
        train, val = stream[:cut], stream[cut:]
    if not train:
        raise InputError("no text found", path=where)
    return Corpus(np.frombuffer(train, np.uint8), np.frombuffer(val, np.uint8), BYTE_VOCAB,
                  {}, 1.0)


def load_corpus(data: tuple[str, ...] | list[str] = (), vocab_size: int | None = None) -> Corpus:
    """The default stdlib corpus, or ``data``: text files/globs, one token array file, or one
    directory of token shards written by `ladder tokenize` (tokens.py, read with Grain)."""
    if not data:
        return stdlib_corpus()
    if len(data) == 1 and os.path.isdir(os.path.expanduser(data[0])):
        from ladder.trainer.tokens import is_shard_dir, load_shards

        if is_shard_dir(os.path.expanduser(data[0])):  # `ladder tokenize` output: Grain feed
            return load_shards(os.path.expanduser(data[0]), vocab_size)
    files = data_files(tuple(data))
    tokens = [f for f in files if f.suffix in TOKEN_SUFFIXES]
    if tokens:
        if len(files) != 1:
            raise InputError("give either one token array (.npy/.bin) or text files, not a mix "
                             "or several arrays", path=",".join(map(str, files)), field="data")
        return _token_corpus(tokens[0], vocab_size)
    if vocab_size not in (None, BYTE_VOCAB):
        raise InputError(f"text files are byte-tokenized (vocab 256); got --vocab-size "
                         f"{vocab_size}", field="vocab_size")
    docs = [(str(f), f.read_bytes()) for f in files]
    corpus = _split_documents(docs, ",".join(map(str, files)))
    listing = "\n".join(f"{n}\t{len(d)}\t{hashlib.sha256(d).hexdigest()}" for n, d in docs)
    fp = {"kind": "text-files", "files": len(docs), "bytes": sum(len(d) for _, d in docs),
          "sha256_files_and_contents": hashlib.sha256(listing.encode()).hexdigest(),
          "train_tokens": len(corpus.train), "val_tokens": len(corpus.val),
          "vocab_size": BYTE_VOCAB, "tokenizer": "bytes"}
    return Corpus(corpus.train, corpus.val, BYTE_VOCAB, fp, 1.0)


def _token_corpus(path: Path, vocab_size: int | None) -> Corpus:
    """A pre-tokenized stream; the last 5% is held out (a flat array has no document names)."""
    if path.suffix == ".npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise InputError(f"not a readable .npy array ({str(e).splitlines()[0]})",
                             path=path) from None
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise InputError(f"expected a 1-D integer token array, got shape {arr.shape} of "
                             f"{arr.dtype}", path=path)
        vocab = vocab_size or int(arr.max()) + 1
    else:
        if vocab_size is None:
            raise InputError("a raw .bin token file needs --vocab-size (it sets uint16 vs "
                             "uint32)", path=path, field="vocab_size")
        dtype = token_dtype(vocab_size)
        size = path.stat().st_size
        if size % np.dtype(dtype).itemsize:
            raise InputError(f"byte length {size} is not a multiple of {np.dtype(dtype).itemsize}"
                             f" ({np.dtype(dtype).name} for vocab {vocab_size}); truncated or "
                             f"wrong dtype", path=path)
        arr = np.memmap(path, dtype=dtype, mode="r")
        vocab = vocab_size
    if len(arr) == 0:
        raise InputError("empty token array", path=path)
    arr = np.asarray(arr)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab:
        bad = hi if hi >= vocab else lo
        pos = int(np.argmax(arr == bad))
        raise InputError(f"token id {bad} at position {pos} is outside the vocabulary "
                         f"[0, {vocab})", path=path, field="vocab_size")
    cut = int(len(arr) * (1 - TAIL_VAL_FRACTION))
    fp = {"kind": "token-array", "path": str(path), "tokens": len(arr),
          "dtype": str(arr.dtype), "sha256": sha256_file(path), "vocab_size": int(vocab),
          "train_tokens": cut, "val_tokens": int(len(arr) - cut),
          "val_rule": f"last {TAIL_VAL_FRACTION:.0%} of the stream"}
    return Corpus(arr[:cut], arr[cut:], int(vocab), fp, None)


def check_vocab(rung, data_vocab: int, field: str, where, *, explicit: bool) -> None:
    """InputError (64) when the data holds token ids ``rung``'s vocabulary lacks, saying how much
    larger the model would be (issue 39: one stray id must not grow the rung 150x)."""
    vocab = rung.model.vocab_size
    if data_vocab <= vocab:
        return
    hint = ""
    if not explicit:
        grown = rung.replace(model=rung.model.replace(vocab_size=data_vocab)).params.total
        hint = (f": the model would grow from {rung.params.total:.3g} to {grown:.3g} params "
                f"({grown / rung.params.total:.3g}x) under the rung's name; pass "
                f"--model.vocab_size={data_vocab} to train that model on purpose, or give data "
                f"within the vocabulary")
    raise InputError(f"has token ids up to {data_vocab - 1}, beyond the model's vocabulary of "
                     f"{vocab}{hint}", path=where, field=field, exit_code=EX_USAGE)
