"""Token data for real runs: shards written by `ladder tokenize`, read through Grain.

Writing (:func:`tokenize_files`): a JSONL or Parquet record (its ``--text-key`` field) or a
plain-text file is one document. Documents are read in corpus order, cut into chunks of
~CHUNK_CHARS characters and encoded (in worker processes) with a local Hugging Face
``tokenizers`` file, each followed by the end-of-document id (EOS); each goes to the held-out
split by a hash (of a text file's path, as data.py does, or of a record's text). The two streams
are appended to ``train-NNNNN.bin`` / ``val-NNNNN.bin`` shards of raw uint16 (vocab up to
65,536) or uint32 ids, so memory does not grow with the corpus. ``manifest.json`` (written last,
atomically) records each shard's tokens, documents and sha256, the tokenizer's sha256,
vocabulary and EOS id, and the text bytes per token (for bits per byte).

Resume: at every shard close (and every PROGRESS_EVERY_S seconds) the open shards are fsynced
and ``progress.json`` records the next document's position, the closed shards and the open ones'
lengths. Started again with the same inputs and options, a run truncates the open shards to
those lengths and continues; the token stream does not depend on chunk boundaries, so the output
is an uninterrupted run's, bitwise.

Reading (:func:`load_shards`, ``ladder run --data DIR``): the shards are memory-mapped. A
training window is ``seq_len + 1`` consecutive tokens inside one shard, starting every
``seq_len`` tokens (every token a target once per epoch). Grain's ``IndexSampler`` shuffles the
windows afresh every epoch (each data-parallel group of processes takes its own shard of them);
its iterator state is saved with every checkpoint, so a resume continues mid-epoch. Every batch
carries ``segment_ids`` (int32 [B, S], a new segment after each EOS): attention stays inside a
document.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import logging
import os
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ladder.io import (
    EX_CANTCREAT,
    EX_NOINPUT,
    EX_USAGE,
    InputError,
    atomic_write_json,
    check_writable,
    claim,
    folder_lock,
    inside,
    known_schema,
    read_json,
    real_folder,
    safe_name,
    schema_version,
    sha256_file,
)
from ladder.trainer.corpus_files import (TAIL_VAL_FRACTION, VAL_BUCKETS, data_files,
                                         eval_windows, is_held_out, token_dtype)

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# 2: documents per shard, the inputs' kinds and text key, records as documents (JSONL,
# Parquet); 1 (still read): text files only, no per-shard document counts
MANIFEST_SCHEMA = "token-shards/2"
# 2**27 tokens: 256 MiB of uint16 per shard, a size that memory-maps and copies comfortably.
DEFAULT_SHARD_TOKENS = 1 << 27
# Conventional end-of-document tokens, tried in order when --eos is not given (GPT-2/Llama 3
# style, SentencePiece style, others).
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")


def segment_ids(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """Document index of every position of ``tokens`` [..., S] within its window: 0 at the
    start, +1 at the position after each EOS (the EOS itself ends its document)."""
    after_eos = np.cumsum(tokens[..., :-1] == eos_id, axis=-1, dtype=np.int32)
    return np.concatenate([np.zeros_like(after_eos[..., :1]), after_eos], axis=-1)


# ------------------------------------------------------------------------------- writing

PROGRESS = "progress.json"
PROGRESS_SCHEMA = "tokenize-progress/1"
SPLITS = ("train", "val")
# ~4M characters per task: big enough that a task's overhead (pickling, one encode_batch call)
# is small against its encoding, small enough that a few in flight stay a few tens of MB.
CHUNK_CHARS = 1 << 22
PROGRESS_EVERY_S = 30.0
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
PARQUET_SUFFIXES = (".parquet",)
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHARD_NAME = re.compile(r"(train|val|stream)-(\d{5,})\.bin")


def input_kind(path: Path) -> str:
    """``jsonl`` or ``parquet`` (a document per record), else ``text`` (one document)."""
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return "text"


# One record of a JSON-lines corpus is one document: 64 MiB of text is ~16M tokens, beyond any
# training document, and bounds what one line holds in memory (a small .jsonl.gz can expand to
# one line of gigabytes, issue 39)
MAX_DOCUMENT_LINE = 64 << 20


# the counters of a split's writer that progress.json records (besides its closed shards)
_COUNTERS = ("open_tokens", "open_documents", "documents", "text_bytes")


def _is_count(v, lo: int = 0, hi: int = 2 ** 62) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def check_progress(prev: dict, path: Path, n_files: int) -> dict:
    """A ``progress.json`` (:data:`PROGRESS_SCHEMA`) with every field the resume reads checked
    for type and range (issue 39); InputError naming the file and the field otherwise."""
    known_schema(prev, (PROGRESS_SCHEMA,), path=path)

    def bad(field, what):
        return InputError(f"expected {what}; remove the folder and start again", path=path,
                          field=field)

    if prev.get("phase") not in ("reading", "recut", "written"):
        raise bad("phase", "'reading', 'recut' or 'written'")
    if not isinstance(prev.get("settings"), dict):
        raise bad("settings", "an object")
    pos = prev.get("position")
    if not (isinstance(pos, list) and len(pos) == 3 and all(_is_count(x) for x in pos)
            and pos[0] <= n_files):
        raise bad("position", f"[input index <= {n_files}, offset, line], integers >= 0")
    splits = prev.get("splits")
    if not isinstance(splits, dict):
        raise bad("splits", "an object of the splits")
    for s in SPLITS:
        st = splits.get(s)
        if not isinstance(st, dict):
            raise bad(f"splits.{s}", "an object")
        for k in _COUNTERS:
            if not _is_count(st.get(k)):
                raise bad(f"splits.{s}.{k}", "an integer >= 0")
        if not isinstance(st.get("shards"), list):
            raise bad(f"splits.{s}.shards", "a list")
        for j, sh in enumerate(st["shards"]):
            if not (isinstance(sh, dict) and isinstance(sh.get("file"), str)
                    and _is_count(sh.get("tokens"))):
                raise bad(f"splits.{s}.shards[{j}]", "{file: name, tokens: integer >= 0}")
    if prev["phase"] == "recut":
        stream = prev.get("stream")
        if not isinstance(stream, list):
            raise bad("stream", "a list")
        for j, sh in enumerate(stream):
            if not (isinstance(sh, dict) and isinstance(sh.get("file"), str)
                    and isinstance(sh.get("from"), str) and _is_count(sh.get("tokens"))):
                raise bad(f"stream[{j}]", "{file, from: names, tokens: integer >= 0}")
    return prev


def _jsonl_documents(f: Path, text_key: str, offset: int, line: int):
    """(text, next offset, next line) of each record of a JSON-lines file from byte ``offset``
    (of the decompressed stream for .gz). Blank lines are skipped; anything else must be a
    JSON object with a string under ``text_key``."""
    opener = gzip.open if f.name.lower().endswith(".gz") else open
    with opener(f, "rb") as fh:
        if offset:
            fh.seek(offset)
        while raw := fh.readline(MAX_DOCUMENT_LINE + 1):
            offset += len(raw)
            line += 1
            if len(raw) > MAX_DOCUMENT_LINE:
                raise InputError(f"line {line}: longer than {MAX_DOCUMENT_LINE >> 20} MiB (one "
                                 f"document a line); refused", path=f)
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8
                raise InputError(f"line {line}: not valid JSON ({str(e).splitlines()[0][:120]})",
                                 path=f) from None
            text = rec.get(text_key) if isinstance(rec, dict) else None
            if not isinstance(text, str):
                raise InputError(f"line {line}: expected a JSON object with a string under "
                                 f"{text_key!r}", path=f, field="--text-key")
            yield text, offset, line


def _parquet_documents(f: Path, text_key: str, row: int):
    """(text, next row, next row) of each row of the ``text_key`` column from row ``row``."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet needs pyarrow; pip install 'ladder[parquet]'",
                         path=f) from None
    try:
        pf = pq.ParquetFile(f)
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"not a readable Parquet file ({str(e).splitlines()[0][:160]})",
                         path=f) from None
    schema = pf.schema_arrow
    if text_key not in schema.names:
        raise InputError(f"no column {text_key!r} (columns: {', '.join(schema.names[:20])})",
                         path=f, field="--text-key")
    kind = schema.field(text_key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"column {text_key!r} is {kind}, not text", path=f, field="--text-key")
    meta = pf.metadata
    first, before = 0, 0        # the row group holding ``row``, and the rows before it
    while first < meta.num_row_groups and before + meta.row_group(first).num_rows <= row:
        before += meta.row_group(first).num_rows
        first += 1
    skip, at = row - before, before
    for batch in pf.iter_batches(batch_size=4096, columns=[text_key],
                                 row_groups=range(first, meta.num_row_groups)):
        for text in batch.column(0).to_pylist():
            at += 1
            if skip:
                skip -= 1
                continue
            if text is None:
                raise InputError(f"row {at - 1}: {text_key!r} is null", path=f,
                                 field="--text-key")
            yield text, at, at


def _documents(files: list[Path], names: list[str], text_key: str, start: tuple):
    """Every document from position ``start`` on, in corpus order, as (split name, text,
    position of the next document). The split name: a plain-text file's relative path, None for
    a record (its text is hashed). A position: (file index, byte offset (JSONL) or row
    (Parquet), line or row number for messages)."""
    for i in range(start[0], len(files)):
        f = files[i]
        offset, line = (start[1], start[2]) if i == start[0] else (0, 0)
        kind = input_kind(f)
        try:
            if kind == "text":
                yield names[i], f.read_bytes().decode("utf-8", errors="replace"), (i + 1, 0, 0)
                continue
            docs = _jsonl_documents(f, text_key, offset, line) if kind == "jsonl" \
                else _parquet_documents(f, text_key, offset)
            for text, offset, line in docs:
                yield None, text, (i, offset, line)
        except (OSError, EOFError, zlib.error) as e:  # unreadable, or a corrupt .gz
            raise InputError(f"cannot be read ({e})", path=f, exit_code=EX_NOINPUT) from None


@dataclass
class _Chunk:
    names: list          # per document: what is hashed for its split (None: the text itself)
    texts: list
    end: tuple           # position of the document after the chunk


def _chunks(docs, chunk_chars: int):
    """``docs`` (:func:`_documents`) in chunks of at least ``chunk_chars`` characters."""
    names, texts, size, pos = [], [], 0, None
    for name, text, pos in docs:
        names.append(name)
        texts.append(text)
        size += len(text)
        if size >= chunk_chars:
            yield _Chunk(names, texts, pos)
            names, texts, size = [], [], 0
    if texts:
        yield _Chunk(names, texts, pos)


class _Encoder:
    """Chunk -> per split: the token ids of its documents, each followed by EOS (one array),
    the end offset of every document in it, and the documents' UTF-8 bytes."""

    def __init__(self, tokenizer, eos_id: int, dtype):
        self.tok, self.eos_id, self.dtype = tokenizer, eos_id, np.dtype(dtype)
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets nobody reads here
        self.encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    def __call__(self, names: list, texts: list) -> dict:
        parts: dict[str, list] = {s: [] for s in SPLITS}
        nbytes = dict.fromkeys(SPLITS, 0)
        sizes = []
        for i, text in enumerate(texts):
            try:
                sizes.append(len(text.encode("utf-8")))
            except UnicodeEncodeError:
                # a lone surrogate (JSON may escape one, "\ud800"): no UTF-8 text holds it, and
                # the tokenizer refuses it; it becomes U+FFFD, as undecodable bytes of a text file
                texts[i] = _SURROGATE.sub("\ufffd", text)
                sizes.append(len(texts[i].encode("utf-8")))
        for name, text, size, enc in zip(names, texts, sizes,
                                         self.encode(texts, add_special_tokens=False)):
            split = "val" if is_held_out(text if name is None else name) else "train"
            ids = enc.ids
            ids.append(self.eos_id)
            parts[split].append(ids)
            nbytes[split] += size
        out = {}
        for split, docs in parts.items():
            ends = np.cumsum([len(d) for d in docs], dtype=np.int64)
            n = int(ends[-1]) if len(ends) else 0
            out[split] = (np.fromiter(itertools.chain.from_iterable(docs), self.dtype, count=n),
                          ends, nbytes[split])
        return out


_WORKER: _Encoder | None = None


def _start_worker(tokenizer_json: str, eos_id: int, dtype: str) -> None:
    """A worker process's tokenizer. One thread each: the processes are the parallelism."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    global _WORKER
    _WORKER = _Encoder(Tokenizer.from_str(tokenizer_json), eos_id, dtype)


def _encode_in_worker(names: list, texts: list) -> dict:
    return _WORKER(names, texts)


class _SplitWriter:
    """The shards of one split: tokens are appended to the open ``<split>-NNNNN.bin.partial``,
    which becomes ``<split>-NNNNN.bin`` (fsync, rename) once it holds ``shard_tokens``, listed
    with its tokens, the documents that end in it (their EOS is in it) and sha256."""

    def __init__(self, out: Path, split: str, dtype, shard_tokens: int, state: dict | None = None):
        self.out, self.split, self.dtype, self.shard_tokens = out, split, np.dtype(dtype), \
            shard_tokens
        state = state or {"shards": []}
        self.closed = list(state["shards"])
        self.open_tokens, self.open_documents, self.documents, self.text_bytes = (
            state.get(k, 0) for k in _COUNTERS)
        self.hash = hashlib.sha256()
        self.file = None
        if self.open_tokens:   # a resumed run: the open shard's first tokens are on disk
            self.file = _open_shard(self._path(".partial"), os.O_RDWR)
            self.file.truncate(self.open_tokens * self.dtype.itemsize)
            for block in iter(lambda: self.file.read(1 << 20), b""):
                self.hash.update(block)

    def _path(self, suffix: str = "") -> Path:
        return self.out / f"{self.split}-{len(self.closed):05d}.bin{suffix}"

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.closed) + self.open_tokens

    def append(self, ids: np.ndarray, ends: np.ndarray, text_bytes: int) -> None:
        self.documents += len(ends)
        self.text_bytes += text_bytes
        pos = 0
        while pos < len(ids):
            part = ids[pos:pos + self.shard_tokens - self.open_tokens]
            if self.file is None:
                self.file = _open_shard(self._path(".partial"), os.O_WRONLY | os.O_CREAT |
                                        os.O_TRUNC)
            self.file.write(part.tobytes())
            self.hash.update(part.tobytes())
            # documents whose end (one past their EOS) falls in this part
            self.open_documents += int(np.searchsorted(ends, pos + len(part), side="right")
                                       - np.searchsorted(ends, pos, side="right"))
            self.open_tokens += len(part)
            pos += len(part)
            if self.open_tokens == self.shard_tokens:
                self.close_shard()

    def close_shard(self) -> None:
        if self.file is None:
            return
        self.sync()
        self.file.close()
        self.file = None
        os.replace(self._path(".partial"), self._path())
        self.closed.append({"file": self._path().name, "tokens": self.open_tokens,
                            "documents": self.open_documents, "sha256": self.hash.hexdigest()})
        self.open_tokens = self.open_documents = 0
        self.hash = hashlib.sha256()

    def sync(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def state(self) -> dict:
        return {"shards": self.closed, **{k: getattr(self, k) for k in _COUNTERS}}


def _open_shard(path: Path, flags: int):
    """A shard file opened without following a symbolic link (a link planted at a shard's name
    would make the writer write into a file it did not make)."""
    return os.fdopen(os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644),
                     "r+b" if flags & os.O_RDWR else "wb")


def _shard_files(out: Path) -> list[tuple[str, int, Path]]:
    """(split, index, path) of every shard file (final or .partial) in ``out``."""
    found = []
    for p in out.iterdir():
        m = _SHARD_NAME.fullmatch(p.name.removesuffix(".partial"))
        if m:
            found.append((m.group(1), int(m.group(2)), p))
    return found


def _restore(out: Path, progress: Path, prev: dict) -> None:
    """Put the shard files back as ``prev`` (the progress file) recorded them: shards closed
    after it was written are opened again (the writers truncate them), later ones removed;
    each listed name must be the one this writer gives (never a path)."""
    for split in SPLITS:
        st = prev["splits"][split]
        for j, sh in enumerate(st["shards"]):
            name = safe_name(sh.get("file"), path=progress, field=f"splits.{split}.shards[{j}]")
            if name != f"{split}-{j:05d}.bin" or not (out / name).is_file():
                raise InputError(f"shard {name!r} is missing or misnamed; remove the folder "
                                 f"and start again", path=progress,
                                 field=f"splits.{split}.shards[{j}]")
        k = len(st["shards"])
        for s, i, p in _shard_files(out):
            if s == split and i > k or s == split and i == k and not st["open_tokens"]:
                p.unlink()
        final, partial = out / f"{split}-{k:05d}.bin", out / f"{split}-{k:05d}.bin.partial"
        if st["open_tokens"]:
            if not partial.exists() and final.exists():
                os.replace(final, partial)   # closed after the progress file was written
            if not partial.exists() or partial.stat().st_size < st["open_tokens"] * \
                    np.dtype(prev["settings"]["dtype"]).itemsize:
                raise InputError(f"the open shard {partial.name} is shorter than recorded; "
                                 f"remove the folder and start again", path=progress,
                                 field=f"splits.{split}.open_tokens")


def _load_encoder(tokenizer: str | Path, eos: str | None):
    """(tokenizer, its JSON bytes, encoder settings, with the sha256 of those bytes) of a local
    tokenizers file."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError("needs the Hugging Face tokenizers library; pip install "
                         "'ladder[data]'", field="--tokenizer") from None
    p = Path(tokenizer)
    if not p.is_file():
        raise InputError("no such file", path=p, field="--tokenizer", exit_code=EX_NOINPUT)
    raw = p.read_bytes()
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the library raises a bare Exception for a malformed file
        raise InputError(f"not a tokenizers JSON file ({str(e).splitlines()[0][:200]})",
                         path=p, field="--tokenizer") from None
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if eos is None:
        eos = next((t for t in EOS_CANDIDATES if tok.token_to_id(t) is not None), None)
        if eos is None:
            raise InputError(f"has none of the usual end-of-document tokens "
                             f"({', '.join(EOS_CANDIDATES)}); name one with --eos",
                             path=tokenizer, field="--eos")
    eos_id = tok.token_to_id(eos)
    if eos_id is None:
        raise InputError(f"token {eos!r} is not in the tokenizer's vocabulary", path=tokenizer,
                         field="--eos")
    dtype = token_dtype(vocab)
    return tok, raw, {"tokenizer_sha256": hashlib.sha256(raw).hexdigest(), "eos": eos,
                      "eos_id": int(eos_id), "vocab_size": int(vocab), "dtype": dtype.name}


def tokenize_files(patterns: list[str], tokenizer: str | Path, out_dir: str | Path, *,
                   eos: str | None = None, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                   text_key: str = "text", processes: int = 0,
                   chunk_chars: int = CHUNK_CHARS, progress_bar: bool = False) -> dict:
    """Tokenize ``patterns`` (text files, JSONL, Parquet) into shards under ``out_dir``; return
    the manifest (also ``out_dir/manifest.json``). ``processes``: worker processes (0: in this
    process, with the tokenizers library's threads). An interrupted run with the same inputs
    and options is continued. ``progress_bar``: a tqdm bar of input bytes on stderr."""
    if shard_tokens < 2:
        raise InputError(f"must be >= 2, got {shard_tokens}", field="--shard-tokens",
                         exit_code=EX_USAGE)
    if processes < 0:
        raise InputError(f"must be >= 0, got {processes}", field="--processes",
                         exit_code=EX_USAGE)
    if not text_key:
        raise InputError("must not be empty", field="--text-key", exit_code=EX_USAGE)
    out = real_folder(out_dir)   # a symbolic link: the checks apply to the real folder
    if (out / MANIFEST).exists():
        raise InputError("already holds token shards; use another --out", path=out / MANIFEST,
                         exit_code=EX_CANTCREAT)
    files = data_files(tuple(patterns))
    # names relative to the files' common folder: the split does not depend on where it lives
    base = Path(os.path.commonpath([str(f.resolve().parent) for f in files]))
    names = [str(f.resolve().relative_to(base)) for f in files]
    tok, tok_json, settings = _load_encoder(tokenizer, eos)
    settings.update(shard_tokens=int(shard_tokens), text_key=text_key)
    inputs = [{"path": n, "bytes": (st := f.stat()).st_size, "mtime_ns": st.st_mtime_ns}
              for f, n in zip(files, names)]
    check_writable(out, field="--out", directory=True)
    # one tokenizer at a time in a folder (two would interleave shards under one manifest), and
    # only into files it wrote: a user's own train-00000.bin is never replaced or deleted
    with folder_lock(out, what="ladder tokenize"):
        if (out / MANIFEST).exists():
            raise InputError("already holds token shards; use another --out",
                             path=out / MANIFEST, exit_code=EX_CANTCREAT)
        claim(out, OWN_FILES, what="ladder tokenize")
        return _tokenize(out, files, names, tok, tok_json, settings, inputs, tokenizer,
                         text_key=text_key, processes=processes, chunk_chars=chunk_chars,
                         progress_bar=progress_bar)


# What a tokenizer writes in its --out (ladder.io.claim)
OWN_FILES = tuple(f"{s}-*.bin{x}" for s in ("train", "val", "stream") for x in ("", ".partial")) \
    + (PROGRESS, MANIFEST)


def _tokenize(out: Path, files, names, tok, tok_json, settings: dict, inputs, tokenizer, *,
              text_key: str, processes: int, chunk_chars: int, progress_bar: bool) -> dict:
    """The body of :func:`tokenize_files`, in the claimed and locked folder ``out``."""
    progress = out / PROGRESS
    prev = None
    if progress.exists():
        prev = check_progress(read_json(progress, schema="tokenize-progress"), progress,
                              len(files))
        for key, value in settings.items():
            if prev["settings"].get(key) != value:
                raise InputError(f"the interrupted run in this folder had {key} = "
                                 f"{prev['settings'].get(key)!r}, this one {value!r}; "
                                 f"run it with the same inputs and options, or use another "
                                 f"--out", path=progress, field=f"settings.{key}",
                                 exit_code=EX_USAGE)
        if prev.get("inputs") != inputs:
            raise InputError("the input files differ from the interrupted run's (names, sizes "
                             "or modification times); run it with the same inputs, or use "
                             "another --out", path=progress, field="inputs", exit_code=EX_USAGE)
        if prev["phase"] != "reading":
            return _finish(out, files, names, settings, tokenizer, prev, processes)
        _restore(out, progress, prev)
        log.info("%s: resuming at input %d of %d", out, prev["position"][0] + 1, len(files))
    else:
        for _, _, p in _shard_files(out):   # leftovers of a run whose progress was never saved
            p.unlink()
    dtype = settings["dtype"]
    writers = {s: _SplitWriter(out, s, dtype, settings["shard_tokens"],
                               prev and prev["splits"][s]) for s in SPLITS}
    position = tuple(prev["position"]) if prev else (0, 0, 0)
    state = {"schema": PROGRESS_SCHEMA, "phase": "reading", "settings": settings,
             "inputs": inputs, "processes": processes}

    def save(pos) -> None:
        for w in writers.values():
            w.sync()
        atomic_write_json(progress, {**state, "position": list(pos),
                                     "splits": {s: w.state() for s, w in writers.items()}})

    if prev is None:
        save(position)
    chunks = _chunks(_documents(files, names, text_key, position), chunk_chars)
    last_save = time.monotonic()
    from tqdm.auto import tqdm
    sizes = [x["bytes"] for x in inputs]
    bar = tqdm(total=sum(sizes), initial=_bytes_done(files, sizes, position), unit="B",
               unit_scale=True, unit_divisor=1024, desc=f"tokenize -> {out.name}",
               disable=not progress_bar, mininterval=0.5, dynamic_ncols=True)

    def consume(end, result) -> None:
        nonlocal last_save
        bar.update(_bytes_done(files, sizes, end) - bar.n)
        closed = sum(len(w.closed) for w in writers.values())
        for s, (ids, ends, nbytes) in result.items():
            writers[s].append(ids, ends, nbytes)
        if sum(len(w.closed) for w in writers.values()) != closed \
                or time.monotonic() - last_save >= PROGRESS_EVERY_S:
            save(end)
            last_save = time.monotonic()

    try:
        if processes == 0:
            encoder = _Encoder(tok, settings["eos_id"], dtype)
            for c in chunks:
                consume(c.end, encoder(c.names, c.texts))
        else:
            import multiprocessing
            from collections import deque
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a worker starts clean (no inherited tokenizer threads or locks)
            with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_start_worker,
                                     initargs=(tok_json.decode("utf-8"), settings["eos_id"],
                                               dtype)) as pool:
                pending: deque = deque()
                try:
                    for c in chunks:    # at most 2 chunks per worker in flight: bounded memory
                        pending.append((c.end, pool.submit(_encode_in_worker, c.names, c.texts)))
                        if len(pending) >= 2 * processes:
                            end, fut = pending.popleft()
                            consume(end, fut.result())
                    while pending:
                        end, fut = pending.popleft()
                        consume(end, fut.result())
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
        for w in writers.values():
            w.close_shard()
        state["phase"] = "written"
        save((len(files), 0, 0))
    finally:
        bar.close()
        for w in writers.values():
            w.close()
    return _finish(out, files, names, settings, tokenizer, read_json(progress), processes)


def _bytes_done(files: list[Path], sizes: list[int], position: tuple) -> int:
    """Input bytes read at ``position``: the files before it, and the offset inside a plain
    JSONL file (a .gz or Parquet file counts when done)."""
    i, offset = int(position[0]), int(position[1])
    done = sum(sizes[:i])
    if i < len(files) and input_kind(files[i]) == "jsonl" and files[i].suffix != ".gz":
        done += min(offset, sizes[i])
    return done


def _split_tokens(splits: dict) -> dict:
    return {s: sum(sh["tokens"] for sh in splits[s]["shards"]) for s in SPLITS}


def _finish(out: Path, files, names, settings: dict, tokenizer, prev: dict,
            processes: int) -> dict:
    """After every document is written: the held-out fallback when a split is empty, then
    manifest.json and the progress file removed."""
    progress = out / PROGRESS
    splits = prev["splits"]
    tokens = _split_tokens(splits)
    if prev["phase"] == "recut" or not tokens["train"] or not tokens["val"]:
        # too few documents for the hash to fill both splits: hold out the stream's last 5%
        splits = _recut(out, prev, settings)
        split_rule = f"last {TAIL_VAL_FRACTION:.0%} of the token stream"
    else:
        split_rule = (f"sha256(path relative to the files' common folder) mod {VAL_BUCKETS} == 0 "
                      f"for a plain-text file (one document); sha256(the record's text) mod "
                      f"{VAL_BUCKETS} == 0 for a JSONL/Parquet record")
    tokens = _split_tokens(splits)
    if tokens["train"] < 2 or tokens["val"] < 2:
        for _, _, p in _shard_files(out):
            p.unlink()
        progress.unlink()
        raise InputError("too little text to make a training and a held-out split",
                         path=",".join(names), field="FILES")
    listing = [f"{n}\t{f.stat().st_size}\t{sha256_file(f)}" for f, n in zip(files, names)]
    kinds = [input_kind(f) for f in files]
    manifest = {
        "schema": MANIFEST_SCHEMA, "dtype": settings["dtype"],
        "vocab_size": settings["vocab_size"], "eos_id": settings["eos_id"],
        "tokenizer": {"path": str(Path(tokenizer).resolve()),
                      "sha256": settings["tokenizer_sha256"], "vocab_size": settings["vocab_size"],
                      "eos": settings["eos"], "eos_id": settings["eos_id"]},
        "sources": {"files": len(files), "bytes": sum(f.stat().st_size for f in files),
                    "kinds": {k: kinds.count(k) for k in sorted(set(kinds))},
                    "text_key": settings["text_key"],
                    "sha256_files_and_contents": hashlib.sha256(
                        "\n".join(listing).encode()).hexdigest()},
        "split_rule": split_rule,
        "splits": {s: {"documents": splits[s]["documents"], "text_bytes": splits[s]["text_bytes"],
                       "tokens": tokens[s], "shards": splits[s]["shards"]} for s in SPLITS},
        "created": time.time(),
    }
    atomic_write_json(out / MANIFEST, manifest)
    progress.unlink()
    return manifest


def _recut(out: Path, prev: dict, settings: dict) -> dict:
    """One split is empty: the whole stream (the other split's shards, renamed ``stream-*``) is
    cut again, its first 95% the training split (documents per shard unknown: null). Resumable:
    the progress file says ``recut`` before the first rename."""
    progress = out / PROGRESS
    splits = prev["splits"]
    src = "train" if splits["train"]["shards"] else "val"
    if prev["phase"] != "recut":
        prev = {**prev, "phase": "recut", "stream": [
            {"file": f"stream-{j:05d}.bin", "from": sh["file"], "tokens": sh["tokens"]}
            for j, sh in enumerate(splits[src]["shards"])]}
        atomic_write_json(progress, prev)
    stream = prev["stream"]
    for j, sh in enumerate(stream):
        dst = out / safe_name(sh["file"], path=progress, field=f"stream[{j}].file")
        if not dst.exists():
            os.replace(out / safe_name(sh["from"], path=progress, field=f"stream[{j}].from"), dst)
    for s, _, p in _shard_files(out):
        if s != "stream":
            p.unlink()
    dtype = np.dtype(settings["dtype"])
    total = sum(sh["tokens"] for sh in stream)
    cut = int(total * (1 - TAIL_VAL_FRACTION))
    writers = {s: _SplitWriter(out, s, dtype, settings["shard_tokens"]) for s in SPLITS}
    none = np.zeros(0, np.int64)
    at = 0
    try:
        for sh in stream:
            arr = np.memmap(out / sh["file"], dtype=dtype, mode="r") if sh["tokens"] else \
                np.zeros(0, dtype)
            for lo in range(0, len(arr), 1 << 24):     # 16M tokens at a time
                piece = np.asarray(arr[lo:lo + (1 << 24)])
                k = min(max(cut - at, 0), len(piece))
                writers["train"].append(piece[:k], none, 0)
                writers["val"].append(piece[k:], none, 0)
                at += len(piece)
            del arr
        for w in writers.values():
            w.close_shard()
    finally:
        for w in writers.values():
            w.close()
    text_bytes = sum(splits[s]["text_bytes"] for s in SPLITS)
    result = {}
    for s, share in (("train", 1 - TAIL_VAL_FRACTION), ("val", TAIL_VAL_FRACTION)):
        result[s] = {"documents": None, "text_bytes": text_bytes * share,
                     "shards": [{**sh, "documents": None} for sh in writers[s].closed]}
    for sh in stream:
        (out / sh["file"]).unlink()
    return result


# ------------------------------------------------------------------------------- reading


class WindowSource:
    """Grain random-access source of training windows over memory-mapped shards: record ``i``
    is ``{"tokens", "targets", "segment_ids"}`` (int32 [S]) of one ``seq_len + 1`` window."""

    def __init__(self, shards: list[np.ndarray], seq_len: int, eos_id: int):
        self.shards, self.seq_len, self.eos_id = shards, seq_len, eos_id
        per = [max(0, (len(s) - 1) // seq_len) for s in shards]  # windows in each shard
        self._first = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._first[-1])

    def __getitem__(self, i: int) -> dict:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = int(np.searchsorted(self._first, i, side="right") - 1)
        lo = (i - int(self._first[k])) * self.seq_len
        w = np.asarray(self.shards[k][lo:lo + self.seq_len + 1], dtype=np.int32)
        tokens = w[:-1]
        return {"tokens": tokens, "targets": w[1:], "segment_ids": segment_ids(tokens,
                                                                              self.eos_id)}

    def __repr__(self) -> str:  # Grain logs its sources
        return f"WindowSource(windows={len(self)}, seq_len={self.seq_len})"


class GrainFeed:
    """Training batches from Grain (the interface of data.PureFeed): rows ``rows`` of every
    global batch (processes holding the same rows read the same shard of the windows). Batches
    are drawn in order; the state before each of the last two is kept for the checkpoint (the
    trainer draws batch k+1 before it saves step k+1)."""

    def __init__(self, source: WindowSource, seed: int, batch: int, rows: slice):
        import grain

        lo, hi = rows.indices(batch)[:2]
        local = hi - lo
        if local < 1 or batch % local:
            raise ValueError(f"rows {rows} do not split a batch of {batch} evenly")
        shard = grain.sharding.ShardOptions(shard_index=lo // local, shard_count=batch // local,
                                            drop_remainder=True)
        if len(source) // shard.shard_count < local:
            raise InputError(f"{len(source)} training windows are fewer than one batch per "
                             f"data-parallel shard ({shard.shard_count} x {local})",
                             field="data")
        sampler = grain.samplers.IndexSampler(
            num_records=len(source), shard_options=shard, shuffle=True, num_epochs=None,
            seed=int(seed) & 0x7FFFFFFF)   # Grain takes a 32-bit seed
        # worker_count=0: a window is a slice of a memory map, cheaper than inter-process copies.
        # Reader threads: Grain's default of 16 drew 2.4x fewer batches/s than 1 thread on this
        # 2-core machine (bench/data_feed.py); half the cores, at most Grain's 16.
        threads = max(1, min(16, (os.cpu_count() or 2) // 2))
        loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=0,
                                  read_options=grain.ReadOptions(num_threads=threads,
                                                                 prefetch_buffer_size=64),
                                  operations=[grain.transforms.Batch(local,
                                                                     drop_remainder=True)])
        self.iterator = iter(loader)
        self.position = 0              # index of the next batch the iterator yields
        self._states: dict[int, bytes] = {}

    def batch(self, index: int) -> dict:
        if index != self.position:
            raise ValueError(f"batches are drawn in order: expected {self.position}, got {index}")
        self._states = {k: v for k, v in self._states.items() if k >= index - 1}
        self._states[index] = self.iterator.get_state()
        self.position += 1
        return next(self.iterator)

    def seek(self, index: int) -> None:
        """The iterator was restored to the state before batch ``index``."""
        self.position = index
        self._states = {}

    def state_for(self, index: int) -> bytes:
        """Iterator state after which the next batch drawn is ``index``."""
        if index == self.position:
            return self.iterator.get_state()
        return self._states[index]


class Stream:
    """Memory-mapped shards read as one 1-D stream (``len``, integer-array indexing) without
    concatenating them: the held-out split of a large corpus is gigabytes."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.bounds = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def __getitem__(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty(idx.shape, self.dtype)
        part = np.searchsorted(self.bounds, idx, side="right") - 1
        for k in np.unique(part):
            sel = part == k
            out[sel] = self.parts[k][idx[sel] - self.bounds[k]]
        return out


@dataclass(frozen=True)
class TokenShards:
    """A tokenized corpus on disk (the Corpus interface of data.py, with a Grain feed)."""

    root: Path
    train_shards: tuple
    val: np.ndarray | Stream   # the held-out stream (its shards unconcatenated)
    vocab_size: int
    eos_id: int
    fingerprint: dict
    bytes_per_token: float | None

    def train_feed(self, seed: int, batch: int, seq_len: int, rows: slice) -> GrainFeed:
        return GrainFeed(WindowSource(list(self.train_shards), seq_len, self.eos_id), seed,
                         batch, rows)

    def eval_batches(self, n_batches: int, batch: int, seq_len: int) -> list[dict]:
        return [{**b, "segment_ids": segment_ids(b["tokens"], self.eos_id)}
                for b in eval_windows(self.val, n_batches, batch, seq_len)]

    def check_fits(self, seq_len: int, where: str) -> None:
        windows = sum(max(0, (len(s) - 1) // seq_len) for s in self.train_shards)
        if windows < 1:
            raise InputError(f"no training shard holds one sequence of {seq_len} + 1 tokens",
                             path=self.root, field="data")
        if len(self.val) < seq_len + 2:
            raise InputError(f"the validation split has {len(self.val)} tokens, fewer than one "
                             f"sequence of {seq_len} + 1", path=self.root, field="data")


def is_shard_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def check_manifest(m: dict, path: Path) -> dict:
    """The fields of a token-shard manifest that :func:`load_shards` reads, checked one by one
    (issue 26: a shard named ``../secret.bin`` is a one-line error naming the field). Fields it
    does not read are left alone (a newer writer may add some)."""
    fix = "rewrite it with `ladder tokenize` (or restore the one it wrote)"

    def bad(field: str, what: str):
        raise InputError(f"{what}; {fix}", path=path, field=field)

    def count(v, field: str, lo: int = 0, hi: int = 2 ** 62):
        if not _is_count(v, lo, hi):
            bad(field, f"expected an integer in [{lo}, {hi}], got {str(v)[:40]!r}")

    for key in ("dtype", "vocab_size", "eos_id", "splits", "tokenizer"):
        if key not in m:
            bad(key, "missing")
    if m["dtype"] not in ("uint16", "uint32"):
        bad("dtype", f"must be uint16 or uint32, got {str(m['dtype'])[:40]!r}")
    hi = 2 ** 16 if m["dtype"] == "uint16" else 2 ** 24  # ladder/specs.py::LIMITS vocab_size
    count(m["vocab_size"], "vocab_size", 1, hi)
    count(m["eos_id"], "eos_id", 0, m["vocab_size"] - 1)
    if not isinstance(m["tokenizer"], dict):
        bad("tokenizer", "expected an object")
    sha = m["tokenizer"].get("sha256")
    if sha is not None and not isinstance(sha, str):
        bad("tokenizer.sha256", "expected a string")
    if not isinstance(m["splits"], dict):
        bad("splits", f"expected an object of splits, got {type(m['splits']).__name__}")
    for split in ("train", "val"):
        sp = m["splits"].get(split, {})
        where = f"splits.{split}"
        if not isinstance(sp, dict):
            bad(where, "expected an object")
        shards = sp.get("shards", [])
        if not isinstance(shards, list):
            bad(f"{where}.shards", "expected a list")
        for i, sh in enumerate(shards):
            at = f"{where}.shards[{i}]"
            if not isinstance(sh, dict) or "file" not in sh or "tokens" not in sh:
                bad(at, "expected an object with file and tokens")
            # the shard's name becomes a path: one safe component, inside the shard directory
            try:
                inside(path.parent, sh["file"], field=f"{at}.file", path=path)
            except InputError as e:
                bad(f"{at}.file", str(e).rpartition("': ")[2])
            count(sh["tokens"], f"{at}.tokens")
        for key in ("tokens", "text_bytes"):
            if sp.get(key) is not None:
                count(sp[key], f"{where}.{key}")
    return m


def load_shards(path: str | Path, vocab_size: int | None = None) -> TokenShards:
    """The memory-mapped shards of a ``ladder tokenize`` directory, checked against the
    manifest (:func:`check_manifest`; a truncated shard is an error naming it)."""
    root = Path(path)
    m = check_manifest(read_json(root / MANIFEST, schema="token-shards"), root / MANIFEST)
    if (schema_version(m) or 0) > 2:
        raise InputError(f"{m['schema']} is newer than this tool reads (token-shards/1, /2)",
                         path=root / MANIFEST, field="schema")
    if vocab_size is not None and vocab_size != m["vocab_size"]:
        raise InputError(f"the shards' tokenizer has vocab {m['vocab_size']}, --vocab-size says "
                         f"{vocab_size}", path=root / MANIFEST, field="vocab_size")
    dtype = np.dtype(m["dtype"])
    maps: dict[str, list[np.ndarray]] = {}
    for split in ("train", "val"):
        maps[split] = []
        for i, sh in enumerate(m["splits"].get(split, {}).get("shards", [])):
            field = f"splits.{split}.shards[{i}]"
            f = inside(root, sh["file"], field=f"{field}.file", path=root / MANIFEST)
            if not f.is_file():
                raise InputError("shard listed in the manifest is missing", path=f,
                                 field=field, exit_code=EX_NOINPUT)
            if f.stat().st_size != sh["tokens"] * dtype.itemsize:
                raise InputError(f"has {f.stat().st_size} bytes, the manifest says "
                                 f"{sh['tokens']} {dtype.name} tokens; truncated or replaced",
                                 path=f, field=f"{field}.tokens")
            maps[split].append(np.memmap(f, dtype=dtype, mode="r"))
    if not maps["train"] or not maps["val"]:
        raise InputError("needs train and val shards", path=root / MANIFEST, field="splits")
    val = maps["val"][0] if len(maps["val"]) == 1 else Stream(maps["val"])
    val_split = m["splits"]["val"]
    bpt = (val_split["text_bytes"] / val_split["tokens"]) \
        if val_split.get("text_bytes") and val_split.get("tokens") else None
    fp = {"kind": "token-shards", "path": str(root.resolve()),
          "manifest_sha256": sha256_file(root / MANIFEST),
          "tokenizer": m["tokenizer"], "tokenizer_sha256": m["tokenizer"].get("sha256"),
          "vocab_size": m["vocab_size"], "eos_id": m["eos_id"], "dtype": m["dtype"],
          "train_tokens": int(sum(len(s) for s in maps["train"])), "val_tokens": int(len(val)),
          "val_rule": m.get("split_rule"), "loader": "grain"}
    return TokenShards(root, tuple(maps["train"]), val, int(m["vocab_size"]), int(m["eos_id"]),
                       fp, bpt)
