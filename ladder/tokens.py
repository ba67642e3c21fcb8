"""Token data for real runs: shards written by `ladder tokenize`, read through Grain.

Writing (``tokenize_files``): each input file is one document, encoded with a Hugging Face
``tokenizers`` file given locally (nothing is fetched), followed by the end-of-document id (EOS).
Documents go to the held-out split by a hash of their path (the rule of ladder.data), and the
two streams are cut into ``train-NNNNN.bin`` / ``val-NNNNN.bin`` shards of raw uint16 (vocab up
to 65,536) or uint32 ids. ``manifest.json`` (written last, atomically: a crash leaves no loadable
half) records the shards with their sizes and sha256, the tokenizer's sha256, vocabulary and EOS
id, and how many text bytes became how many tokens (for bits per byte).

Reading (``load_shards``, what ``ladder run --data DIR`` uses): the shards are memory-mapped. A
training window is ``seq_len + 1`` consecutive tokens inside one shard, windows of a shard start
every ``seq_len`` tokens, so every token is a target exactly once per epoch. Batches come from
Grain: an ``IndexSampler`` over the windows (a fresh shuffle every epoch, without replacement;
each data-parallel group of processes takes its own shard of the windows) and a ``DataLoader``
that batches them; its iterator state is saved with every checkpoint (ladder.checkpointing), so
a resumed run continues the same order mid-epoch. Every batch carries ``segment_ids`` (int32
[B, S]): a new segment starts after each EOS, so attention (and later short convolutions) can be
kept inside a document.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ladder.corpus_files import TAIL_VAL_FRACTION, _expand, is_held_out
from ladder.io import EX_CANTCREAT, EX_NOINPUT, InputError, atomic_write_bytes, \
    atomic_write_json, inside, read_json, sha256_file

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "token-shards/1"
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


def _tokenizer(path: str | Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError("needs the Hugging Face tokenizers library; pip install "
                         "'ladder[data]'", field="--tokenizer") from None
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", path=p, field="--tokenizer", exit_code=EX_NOINPUT)
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # the library raises a bare Exception for a malformed file
        raise InputError(f"not a tokenizers JSON file ({str(e).splitlines()[0][:200]})",
                         path=p, field="--tokenizer") from None


def tokenize_files(patterns: list[str], tokenizer: str | Path, out_dir: str | Path, *,
                   eos: str | None = None, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                   batch_docs: int = 64) -> dict:
    """Tokenize text files (one document each) into shards under ``out_dir``; return the
    manifest (also written to ``out_dir/manifest.json``)."""
    if shard_tokens < 2:
        raise InputError(f"must be >= 2, got {shard_tokens}", field="--shard-tokens")
    out = Path(out_dir)
    if (out / MANIFEST).exists():
        raise InputError("already holds token shards; use another --out", path=out / MANIFEST,
                         exit_code=EX_CANTCREAT)
    files = _expand(tuple(patterns))
    tok = _tokenizer(tokenizer)
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
    # uint16 holds ids below 65,536 (GPT-2-sized vocabularies); larger ones need uint32
    dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)

    streams: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    counts = {"train": {"documents": 0, "text_bytes": 0}, "val": {"documents": 0,
                                                                   "text_bytes": 0}}
    listing = []
    # held out by the hash of the path relative to the files' common folder: the split does not
    # depend on where the corpus lives
    base = Path(os.path.commonpath([str(f.resolve().parent) for f in files]))
    for i in range(0, len(files), batch_docs):
        chunk = files[i:i + batch_docs]
        texts = []
        for f in chunk:
            data = f.read_bytes()
            listing.append(f"{f}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}")
            texts.append(data.decode("utf-8", errors="replace"))
        for f, text, enc in zip(chunk, texts, tok.encode_batch(texts, add_special_tokens=False)):
            split = "val" if is_held_out(str(f.resolve().relative_to(base))) else "train"
            streams[split].append(np.asarray(enc.ids + [eos_id], dtype=dtype))
            counts[split]["documents"] += 1
            counts[split]["text_bytes"] += len(text.encode("utf-8"))
    joined = {k: np.concatenate(v) if v else np.zeros(0, dtype) for k, v in streams.items()}
    if not len(joined["train"]) or not len(joined["val"]):
        # too few documents for the hash to fill both splits: hold out the stream's last 5%
        stream = np.concatenate([joined["train"], joined["val"]])
        cut = int(len(stream) * (1 - TAIL_VAL_FRACTION))
        joined = {"train": stream[:cut], "val": stream[cut:]}
        total = {k: sum(c[k] for c in counts.values()) for k in ("documents", "text_bytes")}
        counts = {"train": {"documents": None, "text_bytes": total["text_bytes"] *
                            (1 - TAIL_VAL_FRACTION)},
                  "val": {"documents": None, "text_bytes": total["text_bytes"] *
                          TAIL_VAL_FRACTION}}
        split_rule = f"last {TAIL_VAL_FRACTION:.0%} of the token stream"
    else:
        split_rule = "sha256(path relative to the files' common folder) mod 20 == 0"
    if len(joined["train"]) < 2 or len(joined["val"]) < 2:
        raise InputError("too little text to make a training and a held-out split",
                         path=",".join(patterns), field="FILES")

    shards: dict[str, list[dict]] = {}
    for split, arr in joined.items():
        shards[split] = []
        for j, lo in enumerate(range(0, len(arr), shard_tokens)):
            part = np.ascontiguousarray(arr[lo:lo + shard_tokens])
            name = f"{split}-{j:05d}.bin"
            atomic_write_bytes(out / name, part.tobytes())
            shards[split].append({"file": name, "tokens": int(len(part)),
                                  "sha256": hashlib.sha256(part.tobytes()).hexdigest()})
    manifest = {
        "schema": MANIFEST_SCHEMA, "dtype": dtype.name, "vocab_size": int(vocab),
        "eos_id": int(eos_id),
        "tokenizer": {"path": str(Path(tokenizer).resolve()), "sha256": sha256_file(
            Path(tokenizer)), "vocab_size": int(vocab), "eos": eos, "eos_id": int(eos_id)},
        "sources": {"files": len(files), "sha256_files_and_contents": hashlib.sha256(
            "\n".join(listing).encode()).hexdigest()},
        "split_rule": split_rule,
        "splits": {k: {**counts[k], "tokens": int(len(joined[k])), "shards": shards[k]}
                   for k in ("train", "val")},
        "created": time.time(),
    }
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


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
    """Training batches for the trainer from Grain (same interface as ladder.data.PureFeed).

    This process builds rows ``rows`` of every global batch; the processes holding the same rows
    (a data axis that does not span them) read the same shard of the windows. Batches are drawn
    in order; the state before each of the last two is kept for the checkpoint, because the
    trainer draws batch k+1 before it saves step k+1.
    """

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


@dataclass(frozen=True)
class TokenShards:
    """A tokenized corpus on disk (the Corpus interface of ladder.data, with a Grain feed)."""

    root: Path
    train_shards: tuple
    val: np.ndarray
    vocab_size: int
    eos_id: int
    fingerprint: dict
    bytes_per_token: float | None

    def train_feed(self, seed: int, batch: int, seq_len: int, rows: slice) -> GrainFeed:
        return GrainFeed(WindowSource(list(self.train_shards), seq_len, self.eos_id), seed,
                         batch, rows)

    def eval_batches(self, n_batches: int, batch: int, seq_len: int) -> list[dict]:
        """The fixed held-out set: evenly spaced windows of the validation stream."""
        n = n_batches * batch
        starts = np.linspace(0, len(self.val) - seq_len - 1, n).astype(np.int64)
        idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
        w = np.asarray(self.val[idx], dtype=np.int32)
        seg = segment_ids(w[:, :-1], self.eos_id)
        return [{"tokens": w[s, :-1], "targets": w[s, 1:], "segment_ids": seg[s]}
                for s in (slice(i * batch, (i + 1) * batch) for i in range(n_batches))]

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
    (issue 26: a manifest is a file; a shard named ``../secret.bin`` or a ``splits`` list must
    be a one-line error naming the field, with what to do about it). Fields it does not read are
    left alone (a newer writer may add some)."""
    fix = "rewrite it with `ladder tokenize` (or restore the one it wrote)"

    def bad(field: str, what: str):
        raise InputError(f"{what}; {fix}", path=path, field=field)

    def count(v, field: str, lo: int = 0, hi: int = 2 ** 62):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            bad(field, f"expected an integer in [{lo}, {hi}], got {str(v)[:40]!r}")
        return v

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
            if not isinstance(sh, dict):
                bad(at, "expected an object with file and tokens")
            if "file" not in sh or "tokens" not in sh:
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
    """Memory-map the shards of a ``ladder tokenize`` directory; the manifest is checked field
    by field (:func:`check_manifest`) and the sizes against it (a truncated shard is an error
    naming it)."""
    root = Path(path)
    m = check_manifest(read_json(root / MANIFEST, schema="token-shards"), root / MANIFEST)
    if vocab_size is not None and vocab_size != m["vocab_size"]:
        raise InputError(f"the shards' tokenizer has vocab {m['vocab_size']}, --vocab-size says "
                         f"{vocab_size}", path=root / MANIFEST, field="vocab_size")
    dtype = np.dtype(m["dtype"])
    maps: dict[str, list[np.ndarray]] = {}
    for split in ("train", "val"):
        maps[split] = []
        for i, sh in enumerate(m["splits"].get(split, {}).get("shards", [])):
            f = inside(root, sh["file"], field=f"splits.{split}.shards[{i}].file")
            if not f.is_file():
                raise InputError("shard listed in the manifest is missing", path=f,
                                 field=f"splits.{split}.shards[{i}]", exit_code=EX_NOINPUT)
            if f.stat().st_size != sh["tokens"] * dtype.itemsize:
                raise InputError(f"has {f.stat().st_size} bytes, the manifest says "
                                 f"{sh['tokens']} {dtype.name} tokens; truncated or replaced",
                                 path=f, field=f"splits.{split}.shards[{i}].tokens")
            maps[split].append(np.memmap(f, dtype=dtype, mode="r"))
    if not maps["train"] or not maps["val"]:
        raise InputError("needs train and val shards", path=root / MANIFEST, field="splits")
    val = np.concatenate(maps["val"]) if len(maps["val"]) > 1 else maps["val"][0]
    val_split = m["splits"]["val"]
    bpt = (val_split["text_bytes"] / val_split["tokens"]) \
        if val_split.get("text_bytes") and val_split.get("tokens") else None
    manifest_sha = sha256_file(root / MANIFEST)
    fp = {"kind": "token-shards", "path": str(root.resolve()), "manifest_sha256": manifest_sha,
          "tokenizer": m["tokenizer"], "tokenizer_sha256": m["tokenizer"].get("sha256"),
          "vocab_size": m["vocab_size"], "eos_id": m["eos_id"], "dtype": m["dtype"],
          "train_tokens": int(sum(len(s) for s in maps["train"])), "val_tokens": int(len(val)),
          "val_rule": m.get("split_rule"), "loader": "grain"}
    return TokenShards(root, tuple(maps["train"]), val, int(m["vocab_size"]), int(m["eos_id"]),
                       fp, bpt)
