"""Batches per second of the Grain feed over token shards beside the stdlib byte feed, same shape.

Tokenizes some of the Python standard library with a small BPE tokenizer trained here (written
to a temporary directory, removed afterwards), then times drawing N training batches [B, S] from
both feeds in one process, interleaved rounds, best of each. Prints the ratio: the cost of
shuffled, checkpointable, document-aware windows relative to the stateless random windows.

    python bench/data_feed.py [--batches 200] [--batch 32] [--seq 512]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ladder.trainer.data import stdlib_corpus, stdlib_files  # noqa: E402
from ladder.trainer.tokens import load_shards, tokenize_files  # noqa: E402


def _tokenizer(path: Path, texts: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=4096, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(path))


def _time(feed, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        feed.batch(i)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--files", type=int, default=300, help="stdlib files to tokenize")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ladder-bench-"))
    try:
        _, files = stdlib_files()
        files = files[:a.files]
        _tokenizer(tmp / "tokenizer.json", [f.read_text(errors="replace") for f in files[:50]])
        t = time.perf_counter()
        m = tokenize_files([str(f) for f in files], tmp / "tokenizer.json", tmp / "shards")
        tok_s = time.perf_counter() - t
        shards = load_shards(tmp / "shards")
        rows = slice(0, a.batch)
        best = {"bytes (stdlib, pure)": float("inf"), "grain (token shards)": float("inf")}
        for _ in range(a.rounds):
            pure = stdlib_corpus().train_feed(0, a.batch, a.seq, rows)
            grain = shards.train_feed(0, a.batch, a.seq, rows)
            best["bytes (stdlib, pure)"] = min(best["bytes (stdlib, pure)"], _time(pure, a.batches))
            best["grain (token shards)"] = min(best["grain (token shards)"],
                                               _time(grain, a.batches))
        train_tokens = m["splits"]["train"]["tokens"]
        print(f"tokenize: {len(files)} files -> {train_tokens:,} train tokens in {tok_s:.2f} s "
              f"({train_tokens / tok_s:,.0f} tokens/s)")
        for name, s in best.items():
            print(f"{name:>22}: {a.batches / s:8.1f} batches/s of [{a.batch}, {a.seq}]")
        ratio = best["grain (token shards)"] / best["bytes (stdlib, pure)"]
        print(f"grain / pure time per batch: {ratio:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
